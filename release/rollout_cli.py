"""``tandem rollout start|status|promote|abort``: a thin shell over :mod:`release.rollout_controller`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from infra.errors import RolloutError
from infra.registry import open_registry
from release.rollout import DEFAULT_ROLLOUT_PATH, load_rollout_config
from release.rollout_controller import (
    AUDIT_FILE,
    RolloutPhase,
    RolloutState,
    controller_lock,
    load_state,
    open_controller,
    request_command,
)

console = Console()
rollout_app = typer.Typer(
    help="Canary rollout of a candidate release: gate, weighted steps with analysis, rollback, promotion.",
    no_args_is_help=True,
)

CONFIG = typer.Option(DEFAULT_ROLLOUT_PATH, "--config", help="Rollout config YAML.")
STATE_DIR = typer.Option(Path("rollout-state"), "--state-dir", help="Persisted state and audit log.")
REGISTRY = typer.Option(None, "--registry", help="Registry URL for the gate ref and the final report.")


def _print_state(state: RolloutState, state_dir: Path, last: int = 5) -> None:
    table = Table(title=f"rollout {state.name} ({state.rollout_id})", show_header=False)
    for key, value in (
        ("phase", state.phase.value),
        ("step", str(state.step_index)),
        ("weights", f"stable {state.weights['stable']}% / candidate {state.weights['candidate']}%"),
        ("reason", state.reason or "-"),
        ("report", state.report_ref or "-"),
    ):
        table.add_row(key, value)
    console.print(table)
    audit = state_dir / AUDIT_FILE
    if audit.is_file():
        for line in audit.read_text().splitlines()[-last:]:
            record = json.loads(line)
            console.print(f"{record['time']}  [bold]{record['decision']}[/]  {record['reason']}")


@rollout_app.command("start")
def start_command(
    config: Path = CONFIG,
    state_dir: Path = STATE_DIR,
    registry: str | None = REGISTRY,
    poll_interval: float = typer.Option(30.0, "--poll-interval", min=0.01, help="Seconds between decisions."),
    metrics_url: list[str] | None = typer.Option(
        None, "--metrics-url", help="Override metrics.urls (repeat for several endpoints, summed)."
    ),
    max_ticks: int | None = typer.Option(None, "--max-ticks", min=1, help="Stop after this many decisions."),
) -> None:
    """Start (or resume) the rollout and drive it until promoted, rolled back or refused by the gate."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    rollout = load_rollout_config(config)
    with controller_lock(state_dir) as held:
        if not held:
            raise RolloutError(f"{state_dir}: another controller is running this rollout")
        controller = open_controller(
            rollout, state_dir, registry=open_registry(registry), metrics_urls=metrics_url
        )
        state = controller.run(poll_interval, max_ticks=max_ticks)
    _print_state(state, state_dir)
    if state.phase.value in ("rolled_back", "gate_failed", "aborted"):
        raise typer.Exit(code=1)


@rollout_app.command("status")
def status_command(
    state_dir: Path = STATE_DIR, last: int = typer.Option(5, "--last", help="Audit records shown.")
) -> None:
    """Print the persisted state and the latest decisions."""
    state = load_state(state_dir)
    if state is None:
        raise RolloutError(f"{state_dir}: no rollout state (run `tandem rollout start` first)")
    _print_state(state, state_dir, last)


def _force(action: str, config: Path, state_dir: Path, registry: str | None, reason: str) -> None:
    state = load_state(state_dir)
    if state is None:
        raise RolloutError(f"{state_dir}: no rollout state (run `tandem rollout start` first)")
    allowed = (
        {RolloutPhase.RUNNING, RolloutPhase.PROMOTING}
        if action == "promote"
        else {RolloutPhase.PENDING, RolloutPhase.RUNNING, RolloutPhase.PROMOTING, RolloutPhase.ROLLING_BACK}
    )
    if state.phase not in allowed:
        raise RolloutError(f"cannot {action} a rollout that is {state.phase.value}")
    request_command(state_dir, action, reason)
    with controller_lock(state_dir) as held:
        if not held:
            console.print(f"{action} requested; the running controller applies it at its next poll")
            return
        # No controller is running: apply it here and drive the exit (drain, removal) to its end.
        controller = open_controller(load_rollout_config(config), state_dir, registry=open_registry(registry))
        state = controller.run(poll_interval=1.0)
    _print_state(state, state_dir)


@rollout_app.command("promote")
def promote_command(
    config: Path = CONFIG,
    state_dir: Path = STATE_DIR,
    registry: str | None = REGISTRY,
    reason: str = typer.Option("operator promote", "--reason"),
) -> None:
    """Force promotion: all traffic to the candidate, then remove the stable release."""
    _force("promote", config, state_dir, registry, reason)


@rollout_app.command("abort")
def abort_command(
    config: Path = CONFIG,
    state_dir: Path = STATE_DIR,
    registry: str | None = REGISTRY,
    reason: str = typer.Option("operator abort", "--reason"),
) -> None:
    """Force a rollback: candidate weight to 0, then remove the candidate release."""
    _force("abort", config, state_dir, registry, reason)
