"""``tandem distill``: a thin typer shell over :func:`distill.distill_draft`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from distill.api import distill_draft
from distill.config import DistillConfig
from infra.config import load_model_file
from infra.errors import ConfigError

console = Console()


def _parse_keep(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(
            f"--keep: expected comma-separated layer indices like 0,10,20,29, got {value!r}"
        ) from exc


def distill_command(
    teacher: Annotated[
        str, typer.Option(help="Registry ref of the target model, e.g. smollm2-135m-instruct@base.")
    ],
    layers: Annotated[int | None, typer.Option(help="Draft depth; teacher layers spread evenly.")] = None,
    keep: Annotated[str | None, typer.Option(help="Exact teacher layers to keep, e.g. 0,10,20,29.")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps of the main run.")] = None,
    divergence: Annotated[
        str | None, typer.Option(help="fkl, rkl, jsd, tvd or auto (measured sweep).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML/JSON DistillConfig; flags override it.")] = None,
    registry: Annotated[
        str | None, typer.Option(help="Registry URL; default $TANDEM_REGISTRY or ~/.cache/tandem.")
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Checkpoint directory; rerun with the same one to resume.")
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="Draft artifact version (default: UTC timestamp).")
    ] = None,
) -> None:
    """Distill a speculative-decoding draft for TEACHER and publish it to the registry (kind=draft)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    base = load_model_file(config, DistillConfig).model_dump() if config else {}
    overrides = {
        "teacher": teacher,
        "num_layers": layers,
        "keep_layers": _parse_keep(keep),
        "steps": steps,
        "divergence": divergence,
        "registry_url": registry,
        "work_dir": work_dir,
        "version": version,
    }
    base.update({key: value for key, value in overrides.items() if value is not None})
    try:
        settings = DistillConfig.model_validate(base)
    except ValueError as exc:
        raise ConfigError(f"invalid distill settings: {exc}") from exc
    manifest = distill_draft(settings)
    table = Table(title=f"draft {manifest.ref}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "acceptance_before",
        "acceptance_after",
        "greedy_agreement_after",
        "cost_ratio",
        "num_speculative_tokens",
    ):
        value = manifest.metadata.get(key)
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("divergence", str(manifest.metadata.get("divergence")))
    table.add_row("parents", ", ".join(manifest.lineage.parents))
    console.print(table)


def fast_bench_command(
    teacher: Annotated[
        str, typer.Option(help="Registry ref of the target model.")
    ] = "smollm2-135m-instruct@base",
    draft: Annotated[
        str | None, typer.Option(help="Draft ref; default the newest draft of the teacher.")
    ] = None,
    k: Annotated[
        int | None, typer.Option(help="num_speculative_tokens; default the draft's chosen k.")
    ] = None,
    streams: Annotated[int, typer.Option(help="Concurrent streams of the multi-stream phase.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request in the speed phases.")] = 128,
    single_requests: Annotated[int, typer.Option(help="Requests sent one at a time (1-stream phase).")] = 8,
    multi_requests: Annotated[int, typer.Option(help="Requests in the multi-stream phase.")] = 32,
    undistilled: Annotated[
        bool, typer.Option(help="Also measure the undistilled layer-subset draft.")
    ] = True,
    lossless_requests: Annotated[
        int, typer.Option(help="Prompts in the float32 lossless check (0 skips it).")
    ] = 20,
    registry: Annotated[str | None, typer.Option(help="Registry URL.")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where the JSON result goes.")] = Path("bench/results"),
) -> None:
    """Fast tier vs standard tier with vLLM: tokens/s at 1 and N streams, acceptance, lossless check."""
    from distill.bench import run_fast_bench

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run_fast_bench(
        teacher_ref=teacher,
        draft_ref=draft,
        registry_url=registry,
        num_speculative_tokens=k,
        streams=streams,
        max_tokens=max_tokens,
        single_stream_requests=single_requests,
        multi_stream_requests=multi_requests,
        include_undistilled=undistilled,
        lossless_requests=lossless_requests,
        results_dir=results_dir,
    )


def main() -> None:
    """Stand-alone entry point (``python -m distill.cli [distill|bench-fast]``) beside the shared CLI."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("distill")(distill_command)
    app.command("bench-fast")(fast_bench_command)
    app()


if __name__ == "__main__":
    main()
