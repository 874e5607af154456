"""``tandem release``: a thin shell over :func:`release.release.run_release` that prints the stage table."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from release.release import STAGES, ReleaseReport, StageRecord, load_release_config, run_release

console = Console()
STYLE = {"passed": "green", "failed": "bold red", "skipped": "dim", "not_run": "yellow"}


def print_report(report: ReleaseReport) -> None:
    table = Table(title=f"release {report.release_id} of {report.base}")
    for column in ("stage", "status", "artifacts", "seconds", "detail"):
        table.add_column(column, overflow="fold")
    for record in report.stages:
        table.add_row(
            record.stage,
            f"[{STYLE[record.status]}]{record.status}[/]",
            "\n".join(f"{key}: {value}" for key, value in record.artifacts.listed().items()) or "-",
            f"{record.seconds:.1f}" if record.seconds is not None else "-",
            record.detail or "-",
        )
    console.print(table)
    failed = report.failed_stage
    if failed is not None:
        console.print(f"[bold red]release stopped at {failed.stage}:[/] {failed.detail}")
    else:
        console.print("[bold green]release complete[/]")


def release_command(
    base: Annotated[
        str, typer.Option("--base", help="Registry ref serving today, e.g. smollm2-135m-instruct@base.")
    ],
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Release YAML (release.release.ReleaseConfig): per-stage settings."),
    ] = None,
    registry: Annotated[str | None, typer.Option(help="Registry URL (file:// or s3://).")] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Work dir; rerun with the same one to resume.")
    ] = None,
    release_id: Annotated[
        str | None, typer.Option(help="Version of the candidate and draft (default: UTC time).")
    ] = None,
    stages: Annotated[
        str | None, typer.Option(help=f"Comma-separated subset of {','.join(STAGES)} (pipeline order kept).")
    ] = None,
    candidate: Annotated[
        str | None, typer.Option(help="Use this candidate ref instead of posttraining one.")
    ] = None,
    draft: Annotated[str | None, typer.Option(help="Use this draft ref instead of distilling one.")] = None,
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Skip stages that passed before.")
    ] = True,
) -> None:
    """Run a release: posttrain -> distill -> eval -> gate -> rollout, stopping at the first failure.

    Each stage calls the same function as its own command (tandem posttrain, distill, eval, gate, rollout)
    and hands its artifacts (candidate ref, draft ref, eval logs, gate report) to the next. A table of
    stages, status, artifacts and timings is printed at the end; exit 1 names the stage that failed and why.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    inputs = {key: value for key, value in (("candidate", candidate), ("draft", draft)) if value}
    settings = load_release_config(
        config,
        base=base,
        registry=registry,
        work_dir=work_dir,
        release_id=release_id,
        stages=[s.strip() for s in stages.split(",") if s.strip()] if stages else None,
    )
    if inputs:
        settings.inputs = settings.inputs.model_copy(update=inputs)

    def progress(record: StageRecord) -> None:
        console.print(f"[bold]{record.stage}[/] {record.status} {record.detail}".rstrip())

    report = run_release(settings, resume=resume, on_stage=progress)
    print_report(report)
    if not report.passed:
        raise typer.Exit(code=1)
