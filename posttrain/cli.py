"""``tandem posttrain <algorithm>``: one command per registered algorithm (:mod:`posttrain.algorithms`),
all generated from one option signature and run by one stage runner. Light to import: torch,
transformers and trl load inside the commands."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from infra.config import load_config
from posttrain.algorithms import PosttrainAlgorithm, algorithms, get_algorithm

console = Console()
posttrain_app = typer.Typer(
    help="Post-training (SFT, GRPO with verifier rewards, DPO, ...) -> release candidates."
)
ConfigT = TypeVar("ConfigT", bound=BaseModel)

Base = Annotated[
    str, typer.Option(help="Registry ref (or local dir) of the start model, e.g. smollm2-135m-instruct@base.")
]
Tasks = Annotated[
    str,
    typer.Option(
        help="Comma-separated task families: single-turn (documents, long_context) or multi-turn tool "
        "episodes (agent, terminal; pool.rollout picks single-turn scripts for terminal)."
    ),
]
ConfigFile = Annotated[Path | None, typer.Option("--config", help="YAML/JSON file with the stage's config.")]
Steps = Annotated[int | None, typer.Option(help="Optimizer steps.")]
LearningRate = Annotated[float | None, typer.Option("--lr", help="Peak learning rate.")]
Lora = Annotated[bool | None, typer.Option("--lora/--full", help="LoRA adapters or all weights.")]
WorkDir = Annotated[
    Path | None, typer.Option(help="Run directory (checkpoints, trace); resumed if it holds one.")
]
Registry = Annotated[str | None, typer.Option(help="Registry URL (file:// or s3://); default file registry.")]
Name = Annotated[str | None, typer.Option(help="Registry name of the candidate.")]
Version = Annotated[str | None, typer.Option(help="Candidate version (default: stage + UTC time).")]
Resume = Annotated[
    bool, typer.Option("--resume/--no-resume", help="Resume from the run dir's latest checkpoint.")
]
Budget = Annotated[
    float | None,
    typer.Option(help="Training time budget in seconds, counted across resumes; stops with a checkpoint."),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="rl: Ray cluster to join (default: RAY_ADDRESS, else a local Ray started for the run)."
    ),
]
Engines = Annotated[int | None, typer.Option(min=1, help="rl: vLLM rollout engines (Ray actors).")]
Learners = Annotated[int | None, typer.Option(min=1, help="rl: Ray Train learner workers (DDP ranks).")]
Staleness = Annotated[
    int | None,
    typer.Option(
        min=0, help="rl: policy versions rollouts may lag (0 synchronous, 1 overlaps sampling and training)."
    ),
]
Pairs = Annotated[
    str | None,
    typer.Option(
        help="dpo: comma-separated preference sources: verifier (labelled rollouts) and/or "
        "reviews:<session>[@version] (blind-review preferences), e.g. verifier,reviews:support-w49."
    ),
]
SingleProcess = Annotated[
    bool, typer.Option("--single-process", help="rl: TRL's GRPOTrainer in this process instead of Ray.")
]


def build_config(
    model: type[ConfigT], path: Path | None, base: str, tasks: str, overrides: dict[str, dict[str, Any]]
) -> ConfigT:
    """The stage config from an optional file plus command-line overrides; errors name the field."""
    families = [t.strip() for t in tasks.split(",") if t.strip()]
    return load_config(model, path, {**overrides, "base": base, "pool": {"families": families}})


def _overrides(
    steps: int | None,
    lr: float | None,
    lora: bool | None,
    work_dir: Path | None,
    registry: str | None,
    name: str | None,
    version: str | None,
    budget: float | None,
) -> dict[str, dict[str, Any]]:
    return {
        "train": {"max_steps": steps, "learning_rate": lr, "lora": lora, "time_budget_s": budget},
        "output": {
            "work_dir": str(work_dir) if work_dir else None,
            "registry": registry,
            "candidate_name": name,
            "version": version,
        },
    }


def run_stage(
    algorithm: str,
    base: str,
    tasks: str,
    path: Path | None,
    resume: bool,
    overrides: dict[str, Any],
    single_process: bool = False,
) -> None:
    """Build the algorithm's config from the file and the flags, train, and print what came out."""
    registered = get_algorithm(algorithm)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if ("ray" in overrides or single_process) and "ray" not in registered.config.model_fields:
        raise typer.BadParameter(
            f"{algorithm} runs in one process: --ray-address/--engines/--learners/--max-staleness/"
            "--single-process apply to rl"
        )
    if "pairs" in overrides and "pairs" not in registered.config.model_fields:
        raise typer.BadParameter(f"{algorithm} takes no preference pairs: --pairs applies to dpo")
    run = build_config(registered.config, path, base, tasks, overrides)
    if single_process:
        run = run.model_copy(update={"ray": None})
    if (
        "on_progress" not in inspect.signature(registered.train).parameters
        or getattr(run, "ray", None) is None
    ):
        _report(registered.train(run, resume=resume))
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"),
        console=console,
    ) as progress:
        task = progress.add_task(
            f"posttrain {algorithm} on Ray", total=run.train.max_steps, detail="starting"
        )

        def on_progress(row: dict[str, Any]) -> None:
            health = row.get("health", {})
            detail = (
                f"reward {row.get('reward', float('nan')):.3f}  staleness {row.get('staleness', 0):.0f}  "
                f"engines {len(health.get('engines', [])) or row.get('engines', 0)}  "
                f"retries {health.get('retries', 0)}  quarantined {health.get('quarantined', 0)}"
            )
            progress.update(task, completed=int(row["step"]), detail=detail)

        result = registered.train(run, resume=resume, on_progress=on_progress)
    _report(result)


def _report(result: Any) -> None:
    table = Table(title=f"tandem posttrain {result.stage}")
    table.add_column("field")
    table.add_column("value")
    table.add_row("candidate", str(result.candidate_ref))
    table.add_row("run", str(result.run_ref))
    table.add_row("run dir", result.run_dir)
    for key, value in result.metrics.items():
        table.add_row(key, str(value))
    console.print(table)


def _command(algorithm: PosttrainAlgorithm) -> Callable[..., None]:
    """The typer command of one algorithm; every algorithm shares this signature."""

    def command(
        base: Base,
        tasks: Tasks = "documents",
        config: ConfigFile = None,
        steps: Steps = None,
        lr: LearningRate = None,
        lora: Lora = None,
        work_dir: WorkDir = None,
        registry: Registry = None,
        name: Name = None,
        version: Version = None,
        resume: Resume = True,
        time_budget: Budget = None,
        ray_address: RayAddress = None,
        engines: Engines = None,
        learners: Learners = None,
        max_staleness: Staleness = None,
        single_process: SingleProcess = False,
        pairs: Pairs = None,
    ) -> None:
        overrides: dict[str, Any] = _overrides(
            steps, lr, lora, work_dir, registry, name, version, time_budget
        )
        if pairs is not None:
            overrides["pairs"] = [source.strip() for source in pairs.split(",") if source.strip()]
        if any(v is not None for v in (ray_address, engines, learners, max_staleness)):
            overrides["ray"] = {
                "address": ray_address,
                "engines": engines,
                "learner": {"workers": learners},
                "max_staleness": max_staleness,
            }
        run_stage(algorithm.name, base, tasks, config, resume, overrides, single_process)

    command.__doc__ = algorithm.summary
    return command


for _algorithm in algorithms():
    posttrain_app.command(_algorithm.name)(_command(_algorithm))
