"""API keys on SQLite and PostgreSQL: hashing, authentication errors, tiers, revocation, the CLI."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.errors import error_body
from gateway.keys import (
    AuthenticationError,
    KeyExists,
    KeyNotFound,
    PermissionDenied,
    SQLKeyStore,
    auth_required,
    bearer_token,
    hash_key,
    open_key_store,
)
from gateway.keys_cli import key_store_url, keys_app
from gateway.policy import AuthPolicy, GatewayPolicy, is_loopback
from infra.errors import ConfigError


@pytest.fixture
def store(store_url: str) -> Iterator[SQLKeyStore]:
    key_store = open_key_store(store_url)
    yield key_store
    key_store.close()


def test_created_key_is_returned_once_and_only_its_hash_is_stored(store: SQLKeyStore) -> None:
    created = store.create("ci", "alice", tiers=["fast"], tools=["search"], requests_per_minute=5)
    assert created.key.startswith("tk-") and len(created.key) > 40
    assert created.record.key_id == created.key[:11]
    assert created.record.tiers == ["fast"] and created.record.tools == ["search"]
    assert created.record.requests_per_minute == 5 and created.record.tokens_per_minute is None
    with store.database.transaction() as cursor:
        cursor.execute("SELECT key_hash FROM tandem_api_keys")
        rows = cursor.fetchall()
        cursor.execute("SELECT * FROM tandem_api_keys")
        everything = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert [row[0] for row in rows] == [hash_key(created.key)]
    assert created.key not in everything
    # A second key gets a different secret.
    assert store.create("other", "bob").key != created.key


def test_authenticate_accepts_a_valid_key(store: SQLKeyStore) -> None:
    created = store.create("app", "alice")
    record = store.authenticate(f"Bearer {created.key}", "standard")
    assert record.key_id == created.record.key_id and record.name == "app"
    assert store.authenticate(f"bearer   {created.key}  ", "auto").owner == "alice"


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Basic dXNlcjpwYXNz", "invalid_authorization_header"),
        ("Bearer", "invalid_authorization_header"),
        ("Bearer tk-not-a-real-key-at-all-000000", "invalid_api_key"),
    ],
)
def test_bad_credentials_are_401(store: SQLKeyStore, header: str | None, code: str) -> None:
    with pytest.raises(AuthenticationError) as caught:
        store.authenticate(header, "standard")
    assert caught.value.status == 401 and caught.value.code == code
    assert caught.value.headers == {"WWW-Authenticate": "Bearer"}
    body = error_body(caught.value.status, caught.value.message, code=caught.value.code)
    assert body["error"]["type"] == "authentication_error"
    # The message never echoes a full unknown key.
    if header and "not-a-real" in header:
        assert "tk-not-a-real-key-at-all-000000" not in caught.value.message


def test_revoked_and_expired_keys_are_401(store: SQLKeyStore) -> None:
    revoked = store.create("gone", "alice")
    assert store.revoke("gone").revoked
    with pytest.raises(AuthenticationError) as caught:
        store.authenticate(f"Bearer {revoked.key}", "standard")
    assert caught.value.code == "api_key_revoked"

    expired = store.create("old", "alice", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(AuthenticationError) as caught:
        store.authenticate(f"Bearer {expired.key}", "standard")
    assert caught.value.code == "api_key_expired"

    later = store.create("later", "alice", expires_at=datetime.now(UTC) + timedelta(days=1))
    assert store.authenticate(f"Bearer {later.key}", "standard").name == "later"


def test_tier_not_allowed_is_403_and_auto_needs_one_tier(store: SQLKeyStore) -> None:
    fast_only = store.create("fast-only", "alice", tiers=["fast"])
    assert store.authenticate(f"Bearer {fast_only.key}", "fast").tiers == ["fast"]
    assert store.authenticate(f"Bearer {fast_only.key}", "auto").name == "fast-only"
    with pytest.raises(PermissionDenied) as caught:
        store.authenticate(f"Bearer {fast_only.key}", "standard")
    assert caught.value.status == 403 and caught.value.code == "tier_not_allowed"
    assert caught.value.param == "model" and "'standard'" in caught.value.message

    nothing = store.create("nothing", "alice", tiers=[])
    with pytest.raises(PermissionDenied):
        nothing.record.require_tier("auto")


def test_names_are_unique_and_unknown_keys_are_reported(store: SQLKeyStore) -> None:
    store.create("dup", "alice")
    with pytest.raises(KeyExists):
        store.create("dup", "bob")
    with pytest.raises(KeyNotFound):
        store.revoke("missing")
    with pytest.raises(ConfigError, match="unknown"):
        store.create("bad-tier", "alice", tiers=["turbo"])
    with pytest.raises(ConfigError, match="at least 1"):
        store.create("bad-limit", "alice", requests_per_minute=0)
    assert [r.name for r in store.list()] == ["dup"]


def test_list_hides_revoked_on_request(store: SQLKeyStore) -> None:
    store.create("a", "x")
    store.create("b", "x")
    store.revoke("a")
    assert [r.name for r in store.list()] == ["a", "b"]
    assert [r.name for r in store.list(include_revoked=False)] == ["b"]


def test_store_is_shared_between_openers(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    first, second = open_key_store(str(path)), open_key_store(f"sqlite:///{path}")
    created = first.create("k", "alice")
    assert second.authenticate(f"Bearer {created.key}", "fast").name == "k"
    first.revoke(created.record.key_id)
    with pytest.raises(AuthenticationError):
        second.authenticate(f"Bearer {created.key}", "fast")
    first.close()
    second.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM tandem_api_keys").fetchone() == (1,)


def test_unsupported_store_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unsupported scheme"):
        open_key_store("mysql://localhost/keys")
    for url in ("sqlite:///", ":memory:", "sqlite:///:memory:"):
        with pytest.raises(ConfigError, match="file path"):
            open_key_store(url)


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    with pytest.raises(AuthenticationError):
        bearer_token("Token abc")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gateway.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_auth_required_by_mode_and_bind() -> None:
    auto = GatewayPolicy()
    assert auth_required(auto, "127.0.0.1") is False
    assert auth_required(auto, "0.0.0.0") is True
    keys = GatewayPolicy(auth=AuthPolicy(mode="keys"))
    assert auth_required(keys, "127.0.0.1") is True
    none = GatewayPolicy(auth=AuthPolicy(mode="none"))
    assert auth_required(none, "localhost") is False
    with pytest.raises(ConfigError, match="without authentication"):
        auth_required(none, "0.0.0.0")
    opted_in = GatewayPolicy(auth=AuthPolicy(mode="none", allow_unauthenticated_remote=True))
    assert auth_required(opted_in, "0.0.0.0") is False


def test_keys_cli_create_list_revoke(tmp_path: Path) -> None:
    runner = CliRunner()
    store = str(tmp_path / "cli.db")
    created = runner.invoke(
        keys_app,
        [
            "create",
            "bench",
            "--owner",
            "ops",
            "--tier",
            "fast",
            "--tool",
            "search",
            "--rpm",
            "7",
            "--expires-in-days",
            "2",
            "--store",
            store,
        ],
        terminal_width=200,
    )
    assert created.exit_code == 0, created.output
    match = re.search(r"tk-[A-Za-z0-9_-]{40,}", created.output)
    assert match is not None, created.output
    key = match.group()
    key_store = open_key_store(store)
    record = key_store.authenticate(f"Bearer {key}", "fast")
    key_store.close()
    assert (record.owner, record.tools, record.requests_per_minute) == ("ops", ["search"], 7)
    assert record.expires_at is not None

    listed = runner.invoke(keys_app, ["list", "--store", store], terminal_width=200)
    assert listed.exit_code == 0 and "bench" in listed.output and "active" in listed.output
    assert key not in listed.output

    revoked = runner.invoke(keys_app, ["revoke", "bench", "--store", store])
    assert revoked.exit_code == 0, revoked.output
    listed = runner.invoke(keys_app, ["list", "--store", store], terminal_width=200)
    assert "revoked" in listed.output
    active = runner.invoke(keys_app, ["list", "--active", "--store", store], terminal_width=200)
    assert "bench" not in active.output

    duplicate = runner.invoke(keys_app, ["create", "bench", "--store", store])
    assert duplicate.exit_code != 0 and isinstance(duplicate.exception, KeyExists)


def test_cli_store_comes_from_flag_then_config_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    config = tmp_path / "tandem.yaml"
    config.write_text(f"model: x\ngateway:\n  auth:\n    key_store: {tmp_path / 'from-config.db'}\n")
    assert key_store_url("postgresql://db/keys", config) == "postgresql://db/keys"
    assert key_store_url(None, config) == str(tmp_path / "from-config.db")
    bare = tmp_path / "bare.yaml"
    bare.write_text("model: x\n")
    assert key_store_url(None, bare) == str(tmp_path / "home" / "gateway.db")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gateway:\n  auth:\n    mode: sometimes\n")
    with pytest.raises(ConfigError, match=r"gateway\.auth\.mode"):
        key_store_url(None, broken)
    runner = CliRunner()
    created = runner.invoke(keys_app, ["create", "via-config", "--config", str(config)])
    assert created.exit_code == 0, created.output
    assert (tmp_path / "from-config.db").is_file()
