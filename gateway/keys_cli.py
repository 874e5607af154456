"""`tandem keys create|list|update|revoke`: manage the gateway's API keys (a thin shell over ``gateway.keys``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from gateway.keys import SCOPES, TIERS, SQLKeyStore, open_key_store
from gateway.policy import GatewayPolicy
from infra.config import load_model_file
from infra.errors import ConfigError

console = Console()

keys_app = typer.Typer(help="Create, list, update and revoke gateway API keys.", no_args_is_help=True)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="TANDEM_KEY_STORE",
        help="Key store: a SQLite path or a postgresql:// URL (default: the config's gateway.auth.key_store, "
        "else $TANDEM_HOME/gateway.db).",
    ),
]
CaptureRateOption = Annotated[
    float | None,
    typer.Option(
        "--capture-rate",
        min=0.0,
        max=1.0,
        help="Fraction of this key's chat requests captured, de-identified, for private eval sets "
        "(`tandem traffic build-set`); 0 is off.",
    ),
]
ScopeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--scope",
        help=f"What the key may do (repeatable; {', '.join(SCOPES)}): 'inference' calls the model endpoints, "
        "'review' signs in to the blind-review page.",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Tandem YAML whose gateway.auth.key_store to use (default: infra/tandem.yaml)."
    ),
]


class _GatewaySection(BaseModel):
    """Only the ``gateway:`` section of a Tandem config; the rest belongs to ``tandem serve``."""

    model_config = ConfigDict(extra="ignore")

    gateway: GatewayPolicy = Field(default_factory=GatewayPolicy)


def key_store_url(store: str | None, config: Path | None) -> str:
    """An explicit store (flag or $TANDEM_KEY_STORE), else the config file's, else the default file."""
    if store:
        return store
    if config is None:
        from gateway.config import DEFAULT_CONFIG_PATH

        config = DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None
    section = load_model_file(config, _GatewaySection) if config is not None else _GatewaySection()
    return section.gateway.auth.key_store_url()


def _store(url: str | None, config: Path | None) -> SQLKeyStore:
    return open_key_store(key_store_url(url, config))


@keys_app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="Unique name of the key.")],
    owner: Annotated[str, typer.Option(help="Who the key belongs to.")] = "",
    tier: Annotated[
        list[str] | None,
        typer.Option("--tier", help=f"Allowed tier (repeatable; {', '.join(TIERS)}). Default: all."),
    ] = None,
    tool: Annotated[
        list[str] | None, typer.Option("--tool", help="Allowed tool name (repeatable). Default: any tool.")
    ] = None,
    no_tools: Annotated[bool, typer.Option("--no-tools", help="Allow no tool calls at all.")] = False,
    rpm: Annotated[
        int | None, typer.Option("--rpm", min=1, help="Requests per minute (default: policy).")
    ] = None,
    tpm: Annotated[
        int | None, typer.Option("--tpm", min=1, help="Tokens per minute (default: policy).")
    ] = None,
    expires_in_days: Annotated[
        float | None, typer.Option("--expires-in-days", min=0, help="Expire after this many days.")
    ] = None,
    capture_rate: CaptureRateOption = None,
    scope: ScopeOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Create a key and print it once; only its hash is stored. Default scope: inference; capture: off."""
    if no_tools and tool:
        raise ConfigError("--no-tools and --tool exclude each other")
    expires_at = datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days is not None else None
    key_store = _store(store, config)
    try:
        created = key_store.create(
            name,
            owner or name,
            tiers=tier or None,
            tools=[] if no_tools else (tool or None),
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
            expires_at=expires_at,
            capture_rate=capture_rate or 0.0,
            scopes=scope or None,
        )
    finally:
        key_store.close()
    console.print(
        Panel(
            f"[bold green]{created.key}[/]\n\nStore it now: it is shown only once and cannot be recovered.",
            title=f"API key {created.record.key_id} ({created.record.name})",
        )
    )


@keys_app.command("list")
def list_command(
    store: StoreOption = None,
    config: ConfigOption = None,
    active: Annotated[bool, typer.Option("--active", help="Hide revoked keys.")] = False,
) -> None:
    """List keys (ids and settings, never the keys themselves)."""
    key_store = _store(store, config)
    try:
        records = key_store.list(include_revoked=not active)
    finally:
        key_store.close()
    table = Table(title=f"{len(records)} API key(s)")
    for column in (
        "id",
        "name",
        "owner",
        "scopes",
        "tiers",
        "tools",
        "rpm",
        "tpm",
        "capture",
        "expires",
        "status",
    ):
        table.add_column(column, no_wrap=True)
    for r in records:
        status = "revoked" if r.revoked else "expired" if r.is_expired() else "active"
        table.add_row(
            r.key_id,
            r.name,
            r.owner,
            ", ".join(r.scopes),
            ", ".join(r.tiers) if r.tiers is not None else "all",
            ", ".join(r.tools) if r.tools is not None else "any",
            str(r.requests_per_minute or "default"),
            str(r.tokens_per_minute or "default"),
            f"{r.capture_rate:g}" if r.capture_rate else "off",
            r.expires_at.isoformat(timespec="seconds") if r.expires_at else "never",
            status,
        )
    # Eleven settings do not fit 80 columns: the table runs wider rather than elide them.
    Console(width=max(console.width, 150)).print(table)


@keys_app.command("update")
def update_command(
    key: Annotated[str, typer.Argument(help="Key id (tk-xxxxxxxx) or name.")],
    capture_rate: CaptureRateOption = None,
    scope: ScopeOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Change a key's capture rate and/or scopes (options left out stay as they are)."""
    if capture_rate is None and not scope:
        raise ConfigError("nothing to update: pass --capture-rate and/or --scope")
    key_store = _store(store, config)
    try:
        record = key_store.update(key, capture_rate=capture_rate, scopes=scope or None)
    finally:
        key_store.close()
    capture = f"{record.capture_rate:g}" if record.capture_rate else "off"
    console.print(
        f"updated {record.key_id} ({record.name}): scopes {', '.join(record.scopes)}; capture {capture}"
    )


@keys_app.command("revoke")
def revoke_command(
    key: Annotated[str, typer.Argument(help="Key id (tk-xxxxxxxx) or name.")],
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    key_store = _store(store, config)
    try:
        record = key_store.revoke(key)
    finally:
        key_store.close()
    console.print(f"revoked {record.key_id} ({record.name})")
