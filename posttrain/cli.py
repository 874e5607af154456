"""``tandem posttrain sft|rl|dpo``: thin typer shells over :func:`posttrain_sft`, :func:`posttrain_rl`
and :func:`posttrain_dpo`. Light to import: torch, transformers and trl load inside the commands."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from infra.config import describe_validation_error
from infra.errors import ConfigError

console = Console()
posttrain_app = typer.Typer(help="Post-training: SFT, GRPO (verifier rewards) and DPO -> release candidates.")
ConfigT = TypeVar("ConfigT", bound=BaseModel)

Base = Annotated[
    str, typer.Option(help="Registry ref (or local dir) of the start model, e.g. smollm2-135m-instruct@base.")
]
Tasks = Annotated[str, typer.Option(help="Comma-separated task families (documents, terminal).")]
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


def build_config(
    model: type[ConfigT], path: Path | None, base: str, tasks: str, overrides: dict[str, dict[str, Any]]
) -> ConfigT:
    """The stage config from an optional file plus command-line overrides; errors name the field."""
    data: dict[str, Any] = {}
    source = str(path) if path else "command line"
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    data["base"] = base
    data.setdefault("pool", {})["families"] = [t.strip() for t in tasks.split(",") if t.strip()]
    for section, values in overrides.items():
        data.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from exc


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


# stage -> (config class in posttrain.config, module, function): imported only when the stage runs.
_STAGES = {
    "sft": ("SFTRunConfig", "posttrain.sft", "posttrain_sft"),
    "rl": ("RLRunConfig", "posttrain.rl", "posttrain_rl"),
    "dpo": ("DPORunConfig", "posttrain.dpo", "posttrain_dpo"),
}


def _run_stage(
    stage: str, base: str, tasks: str, path: Path | None, resume: bool, overrides: dict[str, dict[str, Any]]
) -> None:
    """Build the stage's config from the file and the flags, train, and print what came out."""
    import importlib

    from posttrain import config as configs

    class_name, module, function = _STAGES[stage]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run = build_config(getattr(configs, class_name), path, base, tasks, overrides)
    _report(getattr(importlib.import_module(module), function)(run, resume=resume))


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


@posttrain_app.command("sft")
def sft_command(
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
) -> None:
    """SFT on generator demonstrations of the train split, balanced across families."""
    overrides = _overrides(steps, lr, lora, work_dir, registry, name, version, time_budget)
    _run_stage("sft", base, tasks, config, resume, overrides)


@posttrain_app.command("rl")
def rl_command(
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
) -> None:
    """GRPO with the eval suite's verifiers as rewards, curriculum and guards."""
    overrides = _overrides(steps, lr, lora, work_dir, registry, name, version, time_budget)
    _run_stage("rl", base, tasks, config, resume, overrides)


@posttrain_app.command("dpo")
def dpo_command(
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
) -> None:
    """DPO on verifier-labelled pairs of sampled rollouts."""
    overrides = _overrides(steps, lr, lora, work_dir, registry, name, version, time_budget)
    _run_stage("dpo", base, tasks, config, resume, overrides)
