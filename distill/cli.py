"""``tandem distill``: a thin typer shell over :func:`distill.train_eagle3_head` and :func:`distill.distill_draft`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from distill.api import distill_draft
from distill.config import DistillConfig
from distill.eagle3.config import Eagle3Config
from infra.config import load_config
from infra.errors import ConfigError

console = Console()


class DraftMethod(StrEnum):
    eagle3 = "eagle3"
    layer_subset = "layer-subset"


def _parse_keep(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(
            f"--keep: expected comma-separated layer indices like 0,10,20,29, got {value!r}"
        ) from exc


@contextmanager
def _stage_progress(stream: Console | None = None, every_s: float = 60.0) -> Iterator[Any]:
    """A rich bar per stage, fed by the library's ``progress(stage, done, total, status)`` callback.

    Off a terminal (``nohup``, a CI log) rich draws the bars only when it stops, so a long run would say
    nothing for an hour: there, each stage also prints a plain line at most every ``every_s`` seconds and
    when it finishes.
    """
    out = stream or Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=out,
    )
    tasks: dict[str, Any] = {}
    printed: dict[str, float] = {}
    finished: set[str] = set()

    def update(stage: str, done: int, total: int, status: str) -> None:
        if status.startswith("resumed"):
            progress.console.print(f"{stage}: {status} (checkpoint found in the work dir)")
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total, status=status)
        progress.update(tasks[stage], completed=done, total=total, status=status)
        if out.is_terminal or stage in finished:
            return
        now = time.monotonic()
        if done >= total or now - printed.get(stage, -every_s) >= every_s:
            printed[stage] = now
            if done >= total:
                finished.add(stage)
            out.print(
                f"{time.strftime('%H:%M:%S')} {stage}: {done}/{total} {status}".rstrip(), soft_wrap=True
            )

    with progress:
        yield update


def _settings(model: type[Any], config: Path | None, overrides: dict[str, Any]) -> Any:
    return load_config(model, config, overrides)


def distill_command(
    teacher: Annotated[
        str, typer.Option(help="Registry ref of the target model, e.g. smollm2-135m-instruct@base.")
    ],
    method: Annotated[
        DraftMethod,
        typer.Option(
            help="eagle3: an EAGLE-3 head (1 decoder layer by default) over the target's hidden states (the fast tier's default); "
            "layer-subset: a small draft LM built from a subset of the target's layers."
        ),
    ] = DraftMethod.eagle3,
    config: Annotated[
        Path | None, typer.Option(help="YAML/JSON Eagle3Config or DistillConfig; flags override it.")
    ] = None,
    registry: Annotated[
        str | None, typer.Option(help="Registry URL; default $TANDEM_REGISTRY or ~/.cache/tandem.")
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Data and checkpoints; rerun with the same one to resume.")
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="Draft artifact version (default: UTC timestamp).")
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(help="eagle3: stop training after this many seconds (counted across resumes)."),
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="eagle3: passes over the generated data.")] = None,
    template_prompts: Annotated[
        int | None, typer.Option(help="eagle3: template x topic prompts the target answers greedily.")
    ] = None,
    self_prompts: Annotated[
        int | None, typer.Option(help="eagle3: user turns the target samples itself as further prompts.")
    ] = None,
    extra_prompts: Annotated[
        int | None,
        typer.Option(
            help="eagle3: further template prompts appended after the base set (a larger round "
            "reuses the shards already generated in the same work directory)."
        ),
    ] = None,
    task_prompts: Annotated[
        int | None,
        typer.Option(
            help="eagle3: requests of the kinds the topic banks lack (code, SQL, regex, shell, translation, "
            "arithmetic, facts, practical writing; about 1,800 exist), appended after the extra prompts."
        ),
    ] = None,
    skip_prompts: Annotated[
        int | None,
        typer.Option(
            help="eagle3: leave out the first N prompts (those the --init-from head learned already): a "
            "continuation round answers and trains on new prompts only."
        ),
    ] = None,
    draft_vocab: Annotated[
        int | None,
        typer.Option(
            help="eagle3: reduced draft vocabulary size; larger than an --init-from head's, it grows that "
            "head's vocabulary (trained rows kept, new tokens starting from the target's LM head)."
        ),
    ] = None,
    device: Annotated[str | None, typer.Option(help="eagle3: auto, cpu or cuda[:n].")] = None,
    init_from: Annotated[
        str | None,
        typer.Option(
            help="eagle3: a published head of the same teacher (name@version) to continue training "
            "from, keeping its draft vocabulary (or growing it: --draft-vocab)."
        ),
    ] = None,
    head_layers: Annotated[
        int | None,
        typer.Option(
            help="eagle3: decoder layers of the head (default 1); with --init-from, a smaller head grows, "
            "its new layers starting as the identity."
        ),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help="layer-subset: draft depth, layers spread evenly.")
    ] = None,
    keep: Annotated[
        str | None, typer.Option(help="layer-subset: exact teacher layers, e.g. 0,10,20,29.")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="layer-subset: optimizer steps of the main run.")] = None,
    divergence: Annotated[
        str | None, typer.Option(help="layer-subset: fkl, rkl, jsd, tvd or auto (measured sweep).")
    ] = None,
) -> None:
    """Train a speculative-decoding draft for TEACHER and publish it to the registry (kind=draft).

    The default, an EAGLE-3 head, is trained on the teacher's own greedy answers (generated with vLLM) and
    published in the checkpoint format vLLM's eagle3 loader reads; the fast tier's `auto` picks it up.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    common = {"teacher": teacher, "registry_url": registry, "work_dir": work_dir, "version": version}
    if method is DraftMethod.eagle3:
        from distill.eagle3.api import train_eagle3_head

        settings = _settings(
            Eagle3Config,
            config,
            {
                **common,
                "time_budget_s": time_budget,
                "epochs": epochs,
                "template_prompts": template_prompts,
                "self_prompts": self_prompts,
                "extra_prompts": extra_prompts,
                "task_prompts": task_prompts,
                "skip_prompts": skip_prompts,
                "draft_vocab_size": draft_vocab,
                "device": device,
                "init_from": init_from,
                "head_layers": head_layers,
            },
        )
        with _stage_progress() as progress:
            manifest = train_eagle3_head(settings, progress=progress)
        keys: tuple[str, ...] = (
            "mean_accepted",
            "acceptance_rate",
            "acceptance_per_position",
            "draft_vocab_coverage",
            "cost_ratio",
            "expected_speedup",
            "num_speculative_tokens",
            "train_completion_tokens",
        )
    else:
        settings = _settings(
            DistillConfig,
            config,
            {
                **common,
                "num_layers": layers,
                "keep_layers": _parse_keep(keep),
                "steps": steps,
                "divergence": divergence,
            },
        )
        with _stage_progress() as progress:
            manifest = distill_draft(settings, progress=progress)
        keys = (
            "acceptance_before",
            "acceptance_after",
            "greedy_agreement_after",
            "cost_ratio",
            "num_speculative_tokens",
            "divergence",
        )
    table = Table(title=f"draft {manifest.ref}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in keys:
        value = manifest.metadata.get(key)
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("parents", ", ".join(manifest.lineage.parents))
    console.print(table)


def main() -> None:
    """Stand-alone entry point (``python -m distill.cli distill``) beside the shared CLI."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("distill")(distill_command)
    app()


if __name__ == "__main__":
    main()
