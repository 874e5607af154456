"""The SQL database behind API keys and rate-limit buckets: SQLite (a file) by default, PostgreSQL for a
cluster. One connection per thread; statements are built with the driver's own parameter marker
(:attr:`Database.param`, from its DB-API ``paramstyle``), never rewritten afterwards.

A database that cannot answer (PostgreSQL down or restarting, a SQLite file still locked after the busy
timeout) raises :class:`KeyStoreUnavailable`, a 503 with ``Retry-After``; a connection it broke is dropped,
so the next transaction reconnects and the gateway recovers by itself when the database returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

from gateway.errors import GatewayError
from infra.errors import ConfigError

log = logging.getLogger(__name__)

# DB-API paramstyle -> the positional marker of that style.
_MARKERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}
# SQLite primary result codes that mean "not now" rather than a wrong statement: BUSY, LOCKED, IOERR, CANTOPEN.
_SQLITE_UNAVAILABLE = {5, 6, 10, 14}


class KeyStoreUnavailable(GatewayError):
    """503 with ``Retry-After``: the key store's database cannot answer now (down, restarting, locked)."""

    def __init__(self, dialect: str, retry_after_s: int) -> None:
        super().__init__(
            503,
            f"The API key store ({dialect}) is unavailable, so the request can be neither authenticated nor metered; "
            f"retry in {retry_after_s}s.",
            code="key_store_unavailable",
        )
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(retry_after_s)}


class Database(ABC):
    """A SQL database reached by URL, one connection per thread; statements use :attr:`param` markers.

    ``transaction(write=True)`` serialises writers: SQLite takes the write lock up front (BEGIN
    IMMEDIATE), PostgreSQL relies on row locks taken by the statements inside.
    """

    dialect: Literal["sqlite", "postgresql"]
    paramstyle: str  # the driver's DB-API paramstyle
    retry_after_s: int  # the Retry-After a client is sent while the database cannot answer

    @property
    def param(self) -> str:
        """The driver's positional parameter marker ("?" for sqlite3, "%s" for psycopg)."""
        return _MARKERS[self.paramstyle]

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[tuple[int, Any]] = []
        # Bumped when a connection is found broken: the other threads' connections to the same server
        # died with it, so each reopens before its next use instead of failing one request to find out.
        self._generation = 0

    @abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection."""

    @abstractmethod
    def _begin(self, cursor: Any, write: bool) -> None:
        """Start a transaction on ``cursor``."""

    @abstractmethod
    def _unavailable(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the database cannot answer now (retryable), not a faulty statement."""

    def _connection_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` also means this thread's connection is unusable and must be reopened."""
        return False

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        """A transaction committed on normal exit and rolled back on an exception.

        Raises KeyStoreUnavailable (503, Retry-After) when the database cannot be reached or stays locked.
        """
        try:
            connection = self._connection()
            cursor = connection.cursor()
            try:
                self._begin(cursor, write)
                yield cursor
            except BaseException:
                connection.rollback()
                raise
            else:
                connection.commit()
            finally:
                cursor.close()
        except Exception as exc:
            if not self._unavailable(exc):
                raise
            if self._connection_lost(exc):
                self._discard_connections()
            log.warning("event=key_store_unavailable dialect=%s error=%r", self.dialect, repr(exc)[:300])
            # Fail closed: with no key store a request can be neither authenticated nor metered, and keys
            # are never cached, so an unauthenticated request must not be served; the client retries.
            raise KeyStoreUnavailable(self.dialect, self.retry_after_s) from exc

    @contextmanager
    def schema_transaction(self, lock_key: int) -> Iterator[Cursor]:
        """A write transaction for creating or migrating tables, serialised across processes on PostgreSQL by
        the advisory lock ``lock_key`` (replicas starting together create the tables once); SQLite's write
        transaction already serialises it."""
        with self.transaction(write=True) as cursor:
            if self.dialect == "postgresql":
                cursor.execute(f"SELECT pg_advisory_xact_lock({self.param})", (lock_key,))
            yield cursor

    def _connection(self) -> Any:
        # A connection must not cross a fork or a thread: each (process, thread) opens its own.
        local = self._local
        ours = getattr(local, "pid", None) == os.getpid()
        if ours and local.generation == self._generation:
            return local.connection
        if ours:
            # Another thread found the server gone; this connection went with it.
            self._forget(local.connection)
            local.pid = None
        generation = self._generation
        connection = self._connect()
        local.connection, local.pid, local.generation = connection, os.getpid(), generation
        with self._lock:
            self._opened.append((os.getpid(), connection))
        return connection

    def _discard_connections(self) -> None:
        """Drop this thread's connection now and have every other thread reopen its own before next use."""
        with self._lock:
            self._generation += 1
        if getattr(self._local, "pid", None) == os.getpid():
            self._forget(self._local.connection)
        self._local.pid = None

    def _forget(self, connection: Any) -> None:
        """Close ``connection`` (this process's, possibly broken) and stop tracking it."""
        if connection is None:
            return
        with self._lock:
            self._opened = [(pid, c) for pid, c in self._opened if c is not connection]
        with contextlib.suppress(Exception):
            connection.close()

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
    retry_after_s = 1  # a lock held past the busy timeout is contention, over in moments

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
        # NORMAL, with WAL, syncs at checkpoints rather than at every commit: a commit still survives a
        # process crash (only an OS crash may lose the last ones, never corrupting the file), and writers
        # do not queue behind one fsync per rate-limit debit, the write lock being held meanwhile.
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return connection

    def _begin(self, cursor: Any, write: bool) -> None:
        # IMMEDIATE takes the write lock (waiting up to the busy timeout) before the first read, so a
        # read-then-write never has to upgrade its lock, which SQLite refuses at once with SQLITE_BUSY.
        cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _unavailable(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return (
            isinstance(exc, sqlite3.OperationalError)
            and code is not None
            and code & 0xFF in _SQLITE_UNAVAILABLE
        )


class PostgresDatabase(Database):
    dialect = "postgresql"
    paramstyle = "pyformat"  # psycopg.paramstyle, without importing the driver for SQLite users
    retry_after_s = 5  # a restarting or failing-over server takes seconds

    def __init__(self, url: str, *, connect_timeout_s: int = 3) -> None:
        super().__init__(url)
        # Fail fast when the server is unreachable (libpq's own default waits forever); a URL that sets
        # connect_timeout keeps its own.
        self.connect_timeout_s = connect_timeout_s

    def _connect(self) -> Any:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        options: dict[str, Any] = {}
        if "connect_timeout" not in conninfo_to_dict(self.url):
            options["connect_timeout"] = self.connect_timeout_s
        return psycopg.connect(self.url, autocommit=False, **options)

    def _begin(self, cursor: Any, write: bool) -> None:
        """psycopg opens the transaction itself at the first statement (autocommit is off)."""

    def _unavailable(self, exc: BaseException) -> bool:
        import psycopg

        # Refused, lost or already closed connections, an admin shutdown, a server starting up or out of
        # resources; psycopg raises OperationalError for all of them (a faulty statement is another class).
        return isinstance(exc, psycopg.OperationalError)

    def _connection_lost(self, exc: BaseException) -> bool:
        return self._unavailable(exc)


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
