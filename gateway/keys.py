"""API keys: creation, listing, revocation and per-request authentication.

Only a sha256 hash of each key is stored; the plain key (``tk-...``) is returned once, at creation. Keys
live in a SQL database shared by every ingress replica: a SQLite file by default, PostgreSQL for a
cluster. The rate limiter (``gateway.ratelimit``) keeps its buckets in the same database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, Field

from gateway.database import Database, open_database
from gateway.errors import GatewayError
from gateway.policy import GatewayPolicy, is_loopback
from infra.errors import ConfigError, TandemError

log = logging.getLogger(__name__)

KEY_PREFIX = "tk-"
TIERS = ("standard", "fast", "long")
INFERENCE_SCOPE = "inference"
REVIEW_SCOPE = "review"
SCOPES = (INFERENCE_SCOPE, REVIEW_SCOPE)
DEFAULT_SCOPES = (INFERENCE_SCOPE,)
_KEY_ID_CHARS = 8


# -- errors -----------------------------------------------------------------------------------------
class AuthenticationError(GatewayError):
    """401: no key, an unknown key, or a revoked or expired one."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(401, message, code=code)
        self.headers = {"WWW-Authenticate": "Bearer"}


class PermissionDenied(GatewayError):
    """403: a valid key asked for something it is not allowed (a tier, a tool)."""

    def __init__(self, message: str, *, param: str | None, code: str) -> None:
        super().__init__(403, message, param=param, code=code)


class KeyNotFound(TandemError):
    """No key with that id or name exists in the store."""


class KeyExists(TandemError):
    """Key names are unique within a store."""


# -- records ----------------------------------------------------------------------------------------
class KeyRecord(BaseModel):
    """What the store knows about one key (never the key itself)."""

    key_id: str = Field(description="Public identifier: 'tk-' and the first 8 characters of the secret.")
    name: str
    owner: str
    tiers: list[str] | None = Field(None, description="Tiers this key may use; None means every tier.")
    tools: list[str] | None = Field(
        None, description="Tool names the model may call for this key; None means any tool."
    )
    requests_per_minute: int | None = Field(None, description="None inherits the policy default.")
    tokens_per_minute: int | None = Field(None, description="None inherits the policy default.")
    expires_at: datetime | None = None
    revoked: bool = False
    created_at: datetime
    capture_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of this key's chat requests captured (de-identified) for eval sets; 0 is off.",
    )
    scopes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SCOPES),
        description="What the key may do: 'inference' (the OpenAI endpoints), 'review' (the blind-review page).",
    )

    def allows_tier(self, tier: str) -> bool:
        return self.tiers is None or tier in self.tiers

    def is_expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and self.expires_at.timestamp() <= (
            time.time() if now is None else now
        )

    def require_scope(self, scope: str) -> None:
        """403 ``scope_not_allowed`` unless this key carries ``scope``."""
        if scope not in self.scopes:
            granted = ", ".join(self.scopes) or "none"
            raise PermissionDenied(
                f"This API key does not carry the {scope!r} scope (its scopes: {granted}); create a key with "
                f"`tandem keys create --scope {scope}`.",
                param=None,
                code="scope_not_allowed",
            )

    def require_tier(self, tier: str) -> None:
        """403 unless this key may use ``tier``; 'auto' needs at least one allowed tier."""
        if tier == "auto":
            if self.tiers is not None and not self.tiers:
                raise PermissionDenied(
                    "This API key is not allowed to use any tier.", param="model", code="tier_not_allowed"
                )
            return
        if not self.allows_tier(tier):
            allowed = ", ".join(self.tiers or [])
            raise PermissionDenied(
                f"This API key is not allowed to use the {tier!r} tier (allowed: {allowed}).",
                param="model",
                code="tier_not_allowed",
            )


class CreatedKey(BaseModel):
    """The result of creating a key: the only time the plain key is available."""

    key: str
    record: KeyRecord


def hash_key(plain_key: str) -> str:
    return hashlib.sha256(plain_key.encode()).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_id_of(plain_key: str) -> str:
    return plain_key[: len(KEY_PREFIX) + _KEY_ID_CHARS]


# pg_advisory_xact_lock key serialising concurrent schema creation of the key store (Database.schema_transaction).
_SCHEMA_LOCK = 0x7A4D
_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS tandem_api_keys (
        key_id TEXT PRIMARY KEY,
        key_hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        tiers TEXT,
        tools TEXT,
        requests_per_minute INTEGER,
        tokens_per_minute INTEGER,
        expires_at DOUBLE PRECISION,
        revoked INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        capture_rate DOUBLE PRECISION NOT NULL DEFAULT 0,
        scopes TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS tandem_rate_buckets (
        key_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        level DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (key_id, kind)
    )""",
]

# Columns added after the first release: a store created before them gains them at open (NULL scopes read
# as the default ["inference"], so existing keys keep working unchanged).
_ADDED_COLUMNS = {
    "capture_rate": "DOUBLE PRECISION NOT NULL DEFAULT 0",
    "scopes": "TEXT",
}

_COLUMNS = (
    "key_id, name, owner, tiers, tools, requests_per_minute, tokens_per_minute, expires_at, revoked, "
    "created_at, capture_rate, scopes"
)


def ensure_schema(database: Database) -> None:
    """Create the key and bucket tables, and add any column a store from an older release lacks."""
    with database.schema_transaction(_SCHEMA_LOCK) as cursor:
        for statement in _SCHEMA:
            cursor.execute(statement)
        for column, definition in _ADDED_COLUMNS.items():
            if database.dialect == "postgresql":
                cursor.execute(f"ALTER TABLE tandem_api_keys ADD COLUMN IF NOT EXISTS {column} {definition}")
            else:
                cursor.execute("PRAGMA table_info(tandem_api_keys)")
                if column not in {row[1] for row in cursor.fetchall()}:
                    cursor.execute(f"ALTER TABLE tandem_api_keys ADD COLUMN {column} {definition}")
                    log.info("event=key_store_migrated column=%s", column)


def _timestamp(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _record(row: Sequence[Any]) -> KeyRecord:
    return KeyRecord(
        key_id=row[0],
        name=row[1],
        owner=row[2],
        tiers=json.loads(row[3]) if row[3] is not None else None,
        tools=json.loads(row[4]) if row[4] is not None else None,
        requests_per_minute=row[5],
        tokens_per_minute=row[6],
        expires_at=_timestamp(row[7]),
        revoked=bool(row[8]),
        created_at=_timestamp(row[9]) or datetime.now(UTC),
        capture_rate=float(row[10] or 0.0),
        scopes=json.loads(row[11]) if row[11] is not None else list(DEFAULT_SCOPES),
    )


def check_key_settings(capture_rate: float | None, scopes: Sequence[str] | None) -> None:
    """ConfigError for a capture rate outside [0, 1] or an unknown or empty scope list."""
    if capture_rate is not None and not 0.0 <= capture_rate <= 1.0:
        raise ConfigError(
            f"key capture_rate must be between 0 (off) and 1 (every request), got {capture_rate}"
        )
    if scopes is not None:
        unknown = sorted(set(scopes) - set(SCOPES))
        if unknown:
            raise ConfigError(f"key scopes: unknown {unknown} (allowed: {', '.join(SCOPES)})")
        if not scopes:
            raise ConfigError(f"key scopes: a key needs at least one scope (allowed: {', '.join(SCOPES)})")


# -- the store --------------------------------------------------------------------------------------
class KeyStore(Protocol):
    """Where keys live. ``open_key_store`` returns one; tests and other backends may provide their own."""

    database: Database

    def create(
        self,
        name: str,
        owner: str,
        *,
        tiers: Sequence[str] | None = None,
        tools: Sequence[str] | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        expires_at: datetime | None = None,
        capture_rate: float = 0.0,
        scopes: Sequence[str] | None = None,
    ) -> CreatedKey: ...

    def get(self, key_id_or_name: str) -> KeyRecord: ...
    def list(self, *, include_revoked: bool = True) -> list[KeyRecord]: ...
    def revoke(self, key_id_or_name: str) -> KeyRecord: ...
    def update(
        self, key_id_or_name: str, *, capture_rate: float | None = None, scopes: Sequence[str] | None = None
    ) -> KeyRecord: ...
    def lookup(self, plain_key: str) -> KeyRecord | None: ...
    def authenticate(
        self, authorization: str | None, tier: str, scope: str = INFERENCE_SCOPE
    ) -> KeyRecord: ...
    def close(self) -> None: ...


class SQLKeyStore:
    """A ``KeyStore`` over a SQLite or PostgreSQL ``Database`` (the SQL is shared)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        ensure_schema(database)

    def create(
        self,
        name: str,
        owner: str,
        *,
        tiers: Sequence[str] | None = None,
        tools: Sequence[str] | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        expires_at: datetime | None = None,
        capture_rate: float = 0.0,
        scopes: Sequence[str] | None = None,
    ) -> CreatedKey:
        """Create a key; the returned ``CreatedKey.key`` is the only copy of the plain key.

        ``capture_rate`` (0 = off) samples the key's chat traffic for eval sets (``gateway.capture``);
        ``scopes`` defaults to ["inference"].
        """
        if not name.strip():
            raise ConfigError("key name must not be empty")
        check_key_settings(capture_rate, scopes)
        unknown = sorted(set(tiers or ()) - set(TIERS))
        if unknown:
            raise ConfigError(f"key tiers: unknown {unknown} (allowed: {', '.join(TIERS)})")
        for label, limit in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
        ):
            if limit is not None and limit < 1:
                raise ConfigError(f"key {label} must be at least 1, got {limit}")
        if expires_at is not None and expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        p = self.database.param
        with self.database.transaction(write=True) as cursor:
            cursor.execute(f"SELECT 1 FROM tandem_api_keys WHERE name = {p}", (name,))
            if cursor.fetchone() is not None:
                raise KeyExists(f"a key named {name!r} already exists")
            plain = generate_key()
            cursor.execute(
                f"INSERT INTO tandem_api_keys ({_COLUMNS}, key_hash) VALUES ({', '.join([p] * 13)})",
                (
                    key_id_of(plain),
                    name,
                    owner,
                    json.dumps(sorted(set(tiers))) if tiers is not None else None,
                    json.dumps(sorted(set(tools))) if tools is not None else None,
                    requests_per_minute,
                    tokens_per_minute,
                    expires_at.timestamp() if expires_at else None,
                    0,
                    time.time(),
                    capture_rate,
                    json.dumps(sorted(set(scopes if scopes is not None else DEFAULT_SCOPES))),
                    hash_key(plain),
                ),
            )
        record = self.get(key_id_of(plain))
        log.info("event=key_created key_id=%s name=%r owner=%r", record.key_id, name, owner)
        return CreatedKey(key=plain, record=record)

    def get(self, key_id_or_name: str) -> KeyRecord:
        p = self.database.param
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT {_COLUMNS} FROM tandem_api_keys WHERE key_id = {p} OR name = {p}",
                (key_id_or_name, key_id_or_name),
            )
            row = cursor.fetchone()
        if row is None:
            raise KeyNotFound(f"no API key with id or name {key_id_or_name!r}")
        return _record(row)

    def list(self, *, include_revoked: bool = True) -> list[KeyRecord]:
        with self.database.transaction() as cursor:
            cursor.execute(f"SELECT {_COLUMNS} FROM tandem_api_keys ORDER BY created_at, key_id")
            rows = cursor.fetchall()
        records = [_record(row) for row in rows]
        return records if include_revoked else [r for r in records if not r.revoked]

    def revoke(self, key_id_or_name: str) -> KeyRecord:
        p = self.database.param
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                f"UPDATE tandem_api_keys SET revoked = 1 WHERE key_id = {p} OR name = {p}",
                (key_id_or_name, key_id_or_name),
            )
        record = self.get(key_id_or_name)
        log.info("event=key_revoked key_id=%s name=%r", record.key_id, record.name)
        return record

    def update(
        self, key_id_or_name: str, *, capture_rate: float | None = None, scopes: Sequence[str] | None = None
    ) -> KeyRecord:
        """Change a key's capture rate and/or scopes (None leaves a setting as it is)."""
        check_key_settings(capture_rate, scopes)
        record = self.get(key_id_or_name)
        p = self.database.param
        with self.database.transaction(write=True) as cursor:
            if capture_rate is not None:
                cursor.execute(
                    f"UPDATE tandem_api_keys SET capture_rate = {p} WHERE key_id = {p}",
                    (capture_rate, record.key_id),
                )
            if scopes is not None:
                cursor.execute(
                    f"UPDATE tandem_api_keys SET scopes = {p} WHERE key_id = {p}",
                    (json.dumps(sorted(set(scopes))), record.key_id),
                )
        updated = self.get(record.key_id)
        log.info(
            "event=key_updated key_id=%s capture_rate=%s scopes=%s",
            updated.key_id,
            updated.capture_rate,
            ",".join(updated.scopes),
        )
        return updated

    def lookup(self, plain_key: str) -> KeyRecord | None:
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT {_COLUMNS} FROM tandem_api_keys WHERE key_hash = {self.database.param}",
                (hash_key(plain_key),),
            )
            row = cursor.fetchone()
        return None if row is None else _record(row)

    def authenticate(self, authorization: str | None, tier: str, scope: str = INFERENCE_SCOPE) -> KeyRecord:
        """The key in an ``Authorization: Bearer ...`` header, checked for ``scope`` and ``tier``.

        Raises AuthenticationError (401) for a missing, malformed, unknown, revoked or expired key and
        PermissionDenied (403) when the key lacks ``scope`` (``scope_not_allowed``) or may not use ``tier``.
        """
        plain = bearer_token(authorization)
        record = self.lookup(plain)
        if record is None:
            raise AuthenticationError(
                f"Incorrect API key provided: {_masked(plain)}. Create one with `tandem keys create`.",
                code="invalid_api_key",
            )
        if record.revoked:
            raise AuthenticationError(
                f"The API key {record.key_id}... has been revoked.", code="api_key_revoked"
            )
        if record.is_expired():
            assert record.expires_at is not None
            raise AuthenticationError(
                f"The API key {record.key_id}... expired at {record.expires_at.isoformat()}.",
                code="api_key_expired",
            )
        record.require_scope(scope)
        record.require_tier(tier)
        return record

    def close(self) -> None:
        self.database.close()


def bearer_token(authorization: str | None) -> str:
    """The token of a ``Bearer`` Authorization header; 401 when it is missing or malformed."""
    if not authorization or not authorization.strip():
        raise AuthenticationError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            code="missing_api_key",
        )
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "The Authorization header must be 'Bearer YOUR_KEY'.", code="invalid_authorization_header"
        )
    return token


def _masked(plain: str) -> str:
    return f"{plain[:6]}{'*' * 8}{plain[-4:]}" if len(plain) > 12 else "*" * len(plain)


def open_key_store(url: str) -> SQLKeyStore:
    """The key store at ``url``: a SQLite file path / ``sqlite:///path``, or a ``postgresql://`` URL."""
    return SQLKeyStore(open_database(url))


def auth_required(policy: GatewayPolicy, host: str) -> bool:
    """Whether requests to a gateway bound to ``host`` must carry a key.

    'auto' means no auth on loopback and keys elsewhere. 'none' on a non-loopback bind is refused with a
    ConfigError unless ``allow_unauthenticated_remote`` is set.
    """
    mode = policy.auth.mode
    if mode == "keys":
        return True
    if mode == "auto":
        return not is_loopback(host)
    if not is_loopback(host) and not policy.auth.allow_unauthenticated_remote:
        raise ConfigError(
            f"gateway.auth.mode: 'none' would serve {host!r} without authentication; bind to 127.0.0.1, "
            "use mode 'keys', or set gateway.auth.allow_unauthenticated_remote: true"
        )
    return False
