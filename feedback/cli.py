"""``tandem traffic build-set|list``: private eval sets from captured traffic (a thin shell over
``feedback.sets``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()

traffic_app = typer.Typer(
    help="Private, rotating eval sets built from de-identified gateway traffic (capture is per key: "
    "`tandem keys create --capture-rate`).",
    no_args_is_help=True,
)

RegistryOption = Annotated[
    str | None,
    typer.Option("--registry", envvar="TANDEM_REGISTRY", help="Registry URL (file:// or s3://)."),
]


@traffic_app.command("build-set")
def build_set_command(
    name: Annotated[str, typer.Option("--name", help="Set name; published as traffic-NAME.")],
    period: Annotated[
        str,
        typer.Option(
            "--period",
            help="Rotation period, the set's version: 2026, 2026-q4, 2026-11, 2026-w47 or 2026-11-20 also give "
            "the window; any other label (lowercase, digits, . _ -) needs --since/--until.",
        ),
    ],
    since: Annotated[
        datetime | None,
        typer.Option("--since", help="Window start (UTC, inclusive); overrides the period's."),
    ] = None,
    until: Annotated[
        datetime | None, typer.Option("--until", help="Window end (UTC, exclusive); overrides the period's.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the dev/test split (and of --max-items).")] = 0,
    test_fraction: Annotated[
        float, typer.Option("--test-fraction", min=0.0, max=1.0, help="Share of items in the test split.")
    ] = 0.5,
    max_items: Annotated[
        int | None,
        typer.Option("--max-items", min=1, help="Keep a seeded sample of at most this many items."),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            min=0.05,
            max=0.99,
            help="Jaccard similarity above which prompts are near-duplicates.",
        ),
    ] = 0.8,
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            envvar="TANDEM_KEY_STORE",
            help="Key database holding the captured records (default: the config's gateway.auth.key_store).",
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Tandem YAML whose key store to use.")
    ] = None,
    registry: RegistryOption = None,
) -> None:
    """Dedupe the window's captured prompts, leave out earlier periods' prompts, split dev/test, publish."""
    from feedback.sets import build_set
    from gateway.keys_cli import key_store_url

    built = build_set(
        name,
        period,
        database_url=key_store_url(database, config),
        registry=registry,
        since=since,
        until=until,
        seed=seed,
        test_fraction=test_fraction,
        max_items=max_items,
        threshold=threshold,
    )
    signals = built.manifest.metadata.get("signals") or {}
    console.print(
        f"published [bold]{built.ref}[/]: {built.dev} dev + {built.test} test items from {built.records} records "
        f"({built.duplicates} near-duplicates, {built.retired_overlap} repeats of earlier periods left out); "
        f"signals: {', '.join(f'{k} {v}' for k, v in sorted(signals.items())) or 'none'}"
    )
    if built.retired:
        console.print(f"retired: {', '.join(built.retired)}")
    console.print(
        f"replay it: tandem eval --model MODEL --families traffic --traffic-set {built.ref} --split test"
    )


@traffic_app.command("list")
def list_command(
    name: Annotated[str | None, typer.Option("--name", help="Only this set (NAME or traffic-NAME).")] = None,
    registry: RegistryOption = None,
) -> None:
    """Published traffic eval sets, one row per period; the newest period of each set is current."""
    from feedback.sets import list_sets

    versions = list_sets(registry, name)
    table = Table(title=f"{len(versions)} traffic eval set period(s)")
    for column in ("set", "period", "created", "dev", "test", "status"):
        table.add_column(column, no_wrap=column in ("set", "period", "status"))
    for version in versions:
        table.add_row(
            version.name,
            version.period,
            version.created_at.isoformat(timespec="seconds"),
            str(version.dev),
            str(version.test),
            "[green]current[/]" if version.current else "retired",
        )
    console.print(table)
