"""The SQL database behind API keys and rate-limit buckets: SQLite (a file) by default, PostgreSQL for a
cluster. One connection per thread; statements are built with the driver's own parameter marker
(:attr:`Database.param`, from its DB-API ``paramstyle``), never rewritten afterwards."""

from __future__ import annotations

import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

from infra.errors import ConfigError

# DB-API paramstyle -> the positional marker of that style.
_MARKERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}


class Database(ABC):
    """A SQL database reached by URL, one connection per thread; statements use :attr:`param` markers.

    ``transaction(write=True)`` serialises writers: SQLite takes the write lock up front (BEGIN
    IMMEDIATE), PostgreSQL relies on row locks taken by the statements inside.
    """

    dialect: Literal["sqlite", "postgresql"]
    paramstyle: str  # the driver's DB-API paramstyle

    @property
    def param(self) -> str:
        """The driver's positional parameter marker ("?" for sqlite3, "%s" for psycopg)."""
        return _MARKERS[self.paramstyle]

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[tuple[int, Any]] = []

    @abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection."""

    @abstractmethod
    def transaction(self, *, write: bool = False) -> AbstractContextManager[Cursor]:
        """A transaction committed on normal exit and rolled back on an exception."""

    def _connection(self) -> Any:
        # A connection must not cross a fork or a thread: each (process, thread) opens its own.
        if getattr(self._local, "pid", None) != os.getpid():
            connection = self._connect()
            self._local.connection = connection
            self._local.pid = os.getpid()
            with self._lock:
                self._opened.append((os.getpid(), connection))
        return self._local.connection

    def close(self) -> None:
        """Close every connection this process opened (from any thread)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for pid, connection in opened:
            if pid == os.getpid():
                connection.close()
        self._local = threading.local()


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class SQLiteDatabase(Database):
    dialect = "sqlite"
    paramstyle = sqlite3.paramstyle

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(f"sqlite:///{path}")
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout_s = busy_timeout_s

    def _connect(self) -> sqlite3.Connection:
        # check_same_thread=False: close() may run on another thread; use stays per thread.
        connection = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return connection

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        connection = self._connection()
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield cursor
        except BaseException:
            connection.rollback()
            raise
        else:
            connection.commit()
        finally:
            cursor.close()


class PostgresDatabase(Database):
    dialect = "postgresql"
    paramstyle = "pyformat"  # psycopg.paramstyle, without importing the driver for SQLite users

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=False)

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        connection = self._connection()
        cursor = connection.cursor()
        try:
            yield cursor
        except BaseException:
            connection.rollback()
            raise
        else:
            connection.commit()
        finally:
            cursor.close()


def open_database(url: str) -> Database:
    """``postgresql://...`` / ``postgres://...`` -> PostgreSQL; ``sqlite:///path`` or a plain path -> SQLite."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"key store {url!r} needs the PostgreSQL driver: pip install 'psycopg[binary]'"
            ) from exc
        return PostgresDatabase(url)
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite:///")
    if not url or url == ":memory:":
        # Every thread and replica must see the same keys and buckets: an in-memory database cannot.
        raise ConfigError("key store: a SQLite key store needs a file path, not an in-memory database")
    if "://" in url:
        raise ConfigError(
            f"key store {url!r}: unsupported scheme (allowed: a file path, sqlite:///, postgresql://)"
        )
    return SQLiteDatabase(url)
