"""`tandem serve`: both tiers behind the gateway, until SIGTERM or Ctrl-C (README, "Lifecycle")."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def serve_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Gateway YAML (default: infra/tandem.yaml).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (overrides the config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (overrides the config).")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="Engine dtype for every tier: bfloat16 or float32 (overrides the config)."),
    ] = None,
    registry: Annotated[str | None, typer.Option(help="Registry URL (file:// or s3://).")] = None,
) -> None:
    """Serve the standard and fast tiers behind one OpenAI-compatible API (Ctrl-C stops everything)."""
    from gateway.config import load_config
    from gateway.server import start_gateway, stop_gateway

    settings = load_config(config)
    if host:
        settings.server.host = host
    if port:
        settings.server.port = port
    if registry:
        settings.registry = registry
    if dtype:
        from serving.tiers import EngineConfig

        for tier in settings.tiers:
            tier.engine = EngineConfig.model_validate(tier.engine.model_dump() | {"dtype": dtype})
    from infra.lifecycle import Stop, install

    install()  # main() does too; again here for callers that import the command directly
    stopped: Stop | None = None
    try:
        with console.status("starting Tandem...") as status:
            running = start_gateway(settings, on_progress=lambda message: status.update(f"[bold]{message}"))
        table = Table(title="Tandem is ready", show_header=True)
        table.add_column("model id")
        table.add_column("aliases")
        table.add_column("tier")
        table.add_column("version")
        for route in running.routes:
            table.add_row(route.model_id, ", ".join(route.aliases), route.name, route.version)
        console.print(table)
        console.print(f"OpenAI API: [bold green]{running.openai_url}[/]   health: {running.base_url}/health")
        console.print("Press Ctrl-C to stop.")
        threading.Event().wait()
    except Stop as signal_stop:
        stopped = signal_stop
    finally:
        console.print("shutting down (a second Ctrl-C or SIGTERM forces it)...")
        stop_gateway()
    # SIGTERM is a server's normal end (exit 0); Ctrl-C keeps the shell's 130.
    if stopped is not None:
        console.print(f"stopped ({stopped.name})")
        if stopped.name == "SIGINT":
            sys.exit(stopped.exit_code)
