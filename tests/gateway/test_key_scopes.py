"""Key scopes and capture rates on SQLite and PostgreSQL: defaults, validation, updates, the migration of a
key store created before them, and the CLI."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.database import open_database
from gateway.keys import PermissionDenied, SQLKeyStore, hash_key, open_key_store
from gateway.keys_cli import keys_app
from infra.errors import ConfigError

# The key table as the first release created it, before capture_rate and scopes.
OLD_SCHEMA = """CREATE TABLE tandem_api_keys (
    key_id TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, name TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
    tiers TEXT, tools TEXT, requests_per_minute INTEGER, tokens_per_minute INTEGER,
    expires_at DOUBLE PRECISION, revoked INTEGER NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL
)"""


@pytest.fixture
def store(store_url: str) -> Iterator[SQLKeyStore]:
    key_store = open_key_store(store_url)
    yield key_store
    key_store.close()


def test_defaults_are_inference_only_and_no_capture(store: SQLKeyStore) -> None:
    record = store.create("plain", "alice").record
    assert record.scopes == ["inference"] and record.capture_rate == 0.0


def test_scopes_and_capture_rate_are_stored_and_checked(store: SQLKeyStore) -> None:
    created = store.create("reviewer", "bob", scopes=["review"], capture_rate=0.25)
    assert store.get("reviewer").scopes == ["review"] and store.get("reviewer").capture_rate == 0.25
    looked_up = store.lookup(created.key)
    assert looked_up is not None and "review" in looked_up.scopes
    with pytest.raises(PermissionDenied) as caught:
        store.authenticate(f"Bearer {created.key}", "standard")
    assert caught.value.status == 403 and caught.value.code == "scope_not_allowed"
    assert store.authenticate(f"Bearer {created.key}", "auto", scope="review").name == "reviewer"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"capture_rate": 1.5}, "capture_rate must be between 0"),
        ({"capture_rate": -0.1}, "capture_rate must be between 0"),
        ({"scopes": ["admin"]}, "unknown \\['admin'\\]"),
        ({"scopes": []}, "at least one scope"),
    ],
)
def test_bad_settings_are_config_errors(
    store: SQLKeyStore, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        store.create("bad", "x", **settings)  # type: ignore[arg-type]


def test_update_changes_only_what_is_given(store: SQLKeyStore) -> None:
    store.create("app", "alice", tiers=["fast"])
    record = store.update("app", capture_rate=0.1)
    assert record.capture_rate == 0.1 and record.scopes == ["inference"] and record.tiers == ["fast"]
    record = store.update(record.key_id, scopes=["inference", "review"])
    assert record.capture_rate == 0.1 and record.scopes == ["inference", "review"]
    with pytest.raises(ConfigError):
        store.update("app", capture_rate=2.0)


def test_a_store_from_before_scopes_is_migrated(store_url: str) -> None:
    database = open_database(store_url)
    p = database.param
    with database.transaction(write=True) as cursor:
        cursor.execute(OLD_SCHEMA)
        cursor.execute(
            f"INSERT INTO tandem_api_keys (key_id, key_hash, name, owner, created_at) VALUES ({p}, {p}, {p}, {p}, {p})",
            ("tk-oldkey00", hash_key("tk-oldkey00-secret"), "legacy", "carol", time.time()),
        )
    database.close()
    key_store = open_key_store(store_url)
    record = key_store.authenticate("Bearer tk-oldkey00-secret", "standard")
    assert record.name == "legacy" and record.scopes == ["inference"] and record.capture_rate == 0.0
    assert key_store.update("legacy", capture_rate=0.5).capture_rate == 0.5
    key_store.close()
    key_store = open_key_store(store_url)  # opening again: the migration is idempotent and kept the update
    assert key_store.get("legacy").capture_rate == 0.5
    assert key_store.create("new", "dave", scopes=["review"]).record.scopes == ["review"]
    key_store.close()


def test_cli_create_list_update(tmp_path: Path) -> None:
    runner, store = CliRunner(), str(tmp_path / "keys.db")
    created = runner.invoke(
        keys_app,
        [
            "create",
            "collector",
            "--capture-rate",
            "0.2",
            "--scope",
            "inference",
            "--scope",
            "review",
            "--store",
            store,
        ],
    )
    assert created.exit_code == 0, created.output
    assert re.search(r"tk-[A-Za-z0-9_-]{40,}", created.output)
    listed = runner.invoke(keys_app, ["list", "--store", store], terminal_width=200)
    assert listed.exit_code == 0 and "collector" in listed.output and "0.2" in listed.output
    assert "review" in listed.output
    updated = runner.invoke(keys_app, ["update", "collector", "--capture-rate", "0", "--store", store])
    assert updated.exit_code == 0 and "capture off" in updated.output, updated.output
    bad = runner.invoke(keys_app, ["create", "x", "--capture-rate", "3", "--store", store])
    assert bad.exit_code != 0
    nothing = runner.invoke(keys_app, ["update", "collector", "--store", store])
    assert isinstance(nothing.exception, ConfigError)
