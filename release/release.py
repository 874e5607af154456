"""``tandem release``: one release, end to end — posttrain -> distill -> eval -> gate -> rollout.

Each stage is a plain function registered with :func:`release_stage`, taking the pipeline config and the
artifacts earlier stages produced (``candidate``, ``draft``, logs, the gate report) and returning its own.
The pipeline stops at the first stage that fails and reports every stage's status, artifacts and timing.
Progress is written to ``work_dir/release.json`` after every stage, so running again with the same work dir
skips the stages that already passed and continues with their artifacts. Every stage is also its own
command (``tandem posttrain``, ``tandem distill``, ``tandem eval``, ``tandem gate``, ``tandem rollout``);
this module only calls the same package functions in order.

The stages import their packages lazily: the pipeline sits above every stage, while ``infra`` itself stays
importable without torch, trl or Inspect.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from evalsuite.registry import family_names
from infra.config import load_model_file
from infra.errors import ConfigError, TandemError
from infra.registry import parse_ref
from release.rollout_adapters import atomic_write_text

log = logging.getLogger(__name__)

StageName = Literal["posttrain", "distill", "eval", "gate", "rollout"]
STATE_FILE = "release.json"


class ReleaseError(TandemError):
    """The release pipeline could not run (bad config, unreadable state); a failed stage is not an error."""


class StageFailed(TandemError):
    """A stage ran and its outcome says the release must stop (gate FAIL, rollout rolled back...)."""


# ---------------------------------------------------------------------------------------------- config
class ReleaseArtifacts(BaseModel):
    """What the stages hand each other; a stage returns only the fields it produced."""

    model_config = ConfigDict(extra="forbid")

    candidate: str | None = Field(None, description="posttrain: registry ref of the candidate weights.")
    posttrain_run: str | None = Field(None, description="posttrain: registry ref of the run's record.")
    draft: str | None = Field(None, description="distill: registry ref of the candidate's fast-tier draft.")
    candidate_logs: Path | None = Field(None, description="eval: Inspect logs of the candidate's models.")
    baseline_logs: Path | None = Field(None, description="eval: Inspect logs of the baseline's models.")
    gate_report: Path | None = Field(None, description="gate: the Markdown report (for people).")
    gate_verdict: Path | None = Field(None, description="gate: the GateVerdict JSON rollout reads.")
    rollout_state: Path | None = Field(None, description="rollout: the controller's state directory.")
    rollout_report: str | None = Field(None, description="rollout: registry ref of the audit report.")

    def merged(self, produced: ReleaseArtifacts) -> ReleaseArtifacts:
        """These artifacts with every field ``produced`` set replaced."""
        return self.model_copy(update=produced.model_dump(exclude_none=True))

    def listed(self) -> dict[str, str]:
        """The artifacts that are set, as text (for tables and templates)."""
        return {key: str(value) for key, value in self.model_dump(exclude_none=True).items()}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PosttrainStage(_Strict):
    method: str = Field(
        "sft", description="A registered post-training algorithm (tandem posttrain <method>)."
    )
    config: Path | None = Field(
        None, description="YAML of the stage's run config (as `tandem posttrain --config`)."
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="Run-config fields merged over `config`, e.g. {train: {max_steps: 50}}.",
    )

    @field_validator("method")
    @classmethod
    def _registered(cls, method: str) -> str:
        from posttrain.algorithms import get_algorithm
        from posttrain.errors import PosttrainError

        try:
            get_algorithm(method)
        except PosttrainError as exc:  # pydantic reports ValueErrors as field errors
            raise ValueError(str(exc)) from exc
        return method


class DistillStage(_Strict):
    method: Literal["eagle3", "layer-subset"] = Field(
        "eagle3", description="The draft `tandem distill --method` trains (eagle3: the fast tier's default)."
    )
    config: Path | None = Field(
        None, description="YAML Eagle3Config / DistillConfig (as `tandem distill --config`)."
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="Config fields over `config`.")


class EvalStage(_Strict):
    """What ``tandem eval`` runs for both sides of the gate; ``{candidate}``, ``{draft}``, ``{base}`` in a
    model name become registry refs and ``{candidate_dir}``, ``{base_dir}`` local directories (``hf/...``)."""

    candidate_models: list[str] = Field(
        default_factory=lambda: ["tandem-standard-candidate", "tandem-fast-candidate"],
        min_length=1,
        description="Gateway ids (the candidate's pinned tiers, served with canary.model) or Inspect models.",
    )
    baseline_models: list[str] = Field(
        default_factory=lambda: ["tandem-standard", "tandem-fast"],
        min_length=1,
        description="The stable release, evaluated on the same seeds.",
    )
    base_url: str | None = Field(None, description="OpenAI-compatible URL of the gateway (default :8000/v1).")
    families: list[str] = Field(
        default_factory=lambda: list(family_names()), description="Default: every registered eval family."
    )
    split: str = "test"
    limit: int = Field(30, ge=1, description="Samples per family (the gate wants min_samples pairs).")
    seed: int = 0
    max_samples: int = Field(4, ge=1, description="Samples run concurrently.")
    max_tokens: int = Field(512, ge=1, description="Output tokens per model turn.")


class GateStage(_Strict):
    policy: Path = Field(Path("infra/gate.yaml"), description="Gate policy YAML (as `tandem gate --policy`).")
    human_preference: Path | None = Field(
        None,
        description="Blind-review summary (`tandem review export --out`) for the gate's human-preference row "
        "(as `tandem gate --human-preference`); needed when the policy requires that row.",
    )


class RolloutStage(_Strict):
    config: Path = Field(
        Path("release/rollout.yaml"),
        description="Rollout template: its steps, analysis, traffic, metrics and deployment are used; the "
        "pipeline fills in the candidate, its draft and the gate report.",
    )
    poll_interval: float = Field(30.0, gt=0, description="Seconds between controller decisions.")


class ReleaseConfig(_Strict):
    """One release run. Defaults are the production settings; tests shrink every stage."""

    base: str = Field(description="Registry ref of the model serving today: posttrain starts from it, the "
                      "rollout's stable release is it.")  # fmt: skip
    registry: str | None = Field(
        None, description="Registry URL (file:// or s3://); default $TANDEM_REGISTRY."
    )
    release_id: str = Field(
        default_factory=lambda: datetime.now(UTC).strftime("r%Y%m%d-%H%M%S"),
        description="Version given to the candidate and its draft in the registry.",
    )
    work_dir: Path = Field(Path("release-runs/latest"), description="Stage work dirs, logs, reports, state.")
    stages: list[StageName] = Field(
        default_factory=lambda: list[StageName](["posttrain", "distill", "eval", "gate", "rollout"]),
        description="Stages to run (always in pipeline order); inputs of skipped ones come from `inputs`.",
    )
    inputs: ReleaseArtifacts = Field(
        default_factory=ReleaseArtifacts,
        description="Artifacts given instead of produced, e.g. {candidate: tandem-candidate@v3, draft: ...}.",
    )
    posttrain: PosttrainStage = Field(default_factory=PosttrainStage)
    distill: DistillStage = Field(default_factory=DistillStage)
    eval: EvalStage = Field(default_factory=EvalStage)
    gate: GateStage = Field(default_factory=GateStage)
    rollout: RolloutStage = Field(default_factory=RolloutStage)

    @field_validator("base")
    @classmethod
    def _ref(cls, value: str) -> str:
        parse_ref(value)
        return value


def load_release_config(path: Path | None, **overrides: Any) -> ReleaseConfig:
    """A config from an optional YAML file with command-line values (not None) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        data = load_model_file(path, ReleaseConfig).model_dump(exclude_unset=True)
    data.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return ReleaseConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"{path or 'command line'}: invalid release config: {exc}") from exc


# ---------------------------------------------------------------------------------------------- state
StageStatus = Literal["passed", "failed", "skipped", "not_run"]


class StageRecord(BaseModel):
    stage: StageName
    status: StageStatus = "not_run"
    artifacts: ReleaseArtifacts = Field(default_factory=ReleaseArtifacts)
    detail: str = ""
    started_at: str | None = None
    seconds: float | None = None


class ReleaseReport(BaseModel):
    """Every stage's outcome, in pipeline order; ``failed_stage`` names the one that stopped the release."""

    release_id: str
    base: str
    stages: list[StageRecord]
    artifacts: ReleaseArtifacts = Field(default_factory=ReleaseArtifacts)

    @property
    def failed_stage(self) -> StageRecord | None:
        return next((record for record in self.stages if record.status == "failed"), None)

    @property
    def passed(self) -> bool:
        return self.failed_stage is None


# ---------------------------------------------------------------------------------------------- stages
StageFunction = Callable[[ReleaseConfig, ReleaseArtifacts], ReleaseArtifacts]
STAGES: dict[StageName, StageFunction] = {}


def release_stage(name: StageName) -> Callable[[StageFunction], StageFunction]:
    """Register a stage function; the pipeline runs the registered stages in registration order."""

    def register(function: StageFunction) -> StageFunction:
        STAGES[name] = function
        return function

    return register


def _settings(path: Path | None, settings: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def _need(artifacts: ReleaseArtifacts, name: str, stage: str) -> str:
    value = getattr(artifacts, name)
    if value is None:
        raise StageFailed(f"{stage} needs `{name}`: run the stage that makes it or give inputs.{name}")
    return str(value)


@release_stage("posttrain")
def run_posttrain(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
    """Post-train ``base`` into a candidate published as ``<candidate_name>@<release_id>``."""
    from posttrain.algorithms import get_algorithm

    stage = config.posttrain
    algorithm = get_algorithm(stage.method)
    data = _settings(stage.config, stage.settings)
    data["base"] = config.base
    output = data.setdefault("output", {})
    output.setdefault("registry", config.registry)
    output.setdefault("version", config.release_id)
    output.setdefault("work_dir", str(config.work_dir / "posttrain"))
    try:
        settings = algorithm.config.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"posttrain settings: {exc}") from exc
    result = algorithm.train(settings)
    if result.candidate_ref is None:
        raise StageFailed("posttrain published no candidate (output.publish is off)")
    held_out = {k: v for k, v in result.metrics.items() if "held_out" in k or "pass_rate" in k}
    log.info("release.posttrain candidate=%s metrics=%s", result.candidate_ref, held_out)
    return ReleaseArtifacts(candidate=result.candidate_ref, posttrain_run=result.run_ref)


@release_stage("distill")
def run_distill(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
    """Train the candidate's fast-tier draft, published as ``<candidate name>-eagle3@<release_id>`` (or
    ``-draft@`` for a layer-subset draft)."""
    from distill import DistillConfig, Eagle3Config, distill_draft, train_eagle3_head

    data = _settings(config.distill.config, config.distill.settings)
    data["teacher"] = _need(artifacts, "candidate", "distill")
    data.setdefault("registry_url", config.registry)
    data.setdefault("version", config.release_id)
    data.setdefault("work_dir", str(config.work_dir / "distill"))
    model = Eagle3Config if config.distill.method == "eagle3" else DistillConfig
    try:
        settings: Any = model.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"distill settings: {exc}") from exc
    manifest = train_eagle3_head(settings) if config.distill.method == "eagle3" else distill_draft(settings)
    return ReleaseArtifacts(draft=manifest.ref)


def _model_name(template: str, config: ReleaseConfig, artifacts: ReleaseArtifacts) -> str:
    if "{" not in template:
        return template
    from infra.registry import open_registry, registry_step

    registry = open_registry(config.registry)
    values = {"base": config.base, **artifacts.listed()}
    if "{candidate_dir}" in template:
        candidate = _need(artifacts, "candidate", "eval")
        with registry_step(f"fetching the candidate {candidate} for the eval model {template}"):
            values["candidate_dir"] = str(registry.fetch(candidate))
    if "{base_dir}" in template:
        with registry_step(f"fetching the base {config.base} for the eval model {template}"):
            values["base_dir"] = str(registry.fetch(config.base))
    try:
        return template.format(**values)
    except KeyError as exc:
        raise StageFailed(f"eval model {template!r} names {exc}, which no stage produced") from exc


@release_stage("eval")
def run_eval_stage(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
    """Evaluate the candidate's and the baseline's models on the same seeded samples (Inspect logs)."""
    from inspect_ai.log import read_eval_log

    from evalsuite.runner import run_eval

    stage = config.eval
    produced = ReleaseArtifacts()
    for side, models in (("candidate", stage.candidate_models), ("baseline", stage.baseline_models)):
        log_dir = config.work_dir / "eval" / side
        for template in models:
            model = _model_name(template, config, artifacts)
            paths = run_eval(model, stage.families, stage.split, stage.limit, stage.base_url, log_dir,
                             stage.seed, max_samples=stage.max_samples, max_tokens=stage.max_tokens)  # fmt: skip
            unfinished = [
                p.name for p in paths if read_eval_log(str(p), header_only=True).status != "success"
            ]
            if unfinished:
                raise StageFailed(f"eval of {model} did not complete: {', '.join(unfinished)}")
        setattr(produced, f"{side}_logs", log_dir)
    return produced


@release_stage("gate")
def run_gate_stage(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
    """Apply the paired release gate to the eval logs; a FAIL stops the release."""
    from evalsuite.gate_report import VERDICT_FILE
    from evalsuite.runner import run_gate

    verdict, markdown, _ = run_gate(
        _need(artifacts, "candidate_logs", "gate"),
        _need(artifacts, "baseline_logs", "gate"),
        config.gate.policy,
        config.work_dir / "gate",
        human_preference=config.gate.human_preference,
    )
    if not verdict.passed:
        failing = [f"{check.name}: {check.reason}" for check in verdict.checks if not check.passed]
        raise StageFailed(f"gate FAIL ({markdown}): " + "; ".join(failing))
    return ReleaseArtifacts(gate_report=markdown, gate_verdict=markdown.parent / VERDICT_FILE)


@release_stage("rollout")
def run_rollout_stage(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
    """Canary-roll the candidate out against ``base`` with the template's steps; anything but promoted fails."""
    from infra.registry import open_registry
    from release.rollout import RolloutConfig, load_rollout_config
    from release.rollout_controller import controller_lock, open_controller

    template = load_rollout_config(config.rollout.config)
    candidate = {"model": _need(artifacts, "candidate", "rollout"), "draft": artifacts.draft}
    gate_file = artifacts.gate_verdict or artifacts.gate_report  # the typed verdict; a given report otherwise
    rollout = RolloutConfig.model_validate(
        template.model_dump(mode="json", exclude={"gate"})
        | {
            "name": f"{template.name}-{config.release_id}".lower()[:120],
            "stable": {"model": config.base},
            "candidate": candidate,
            "gate": {"path": str(gate_file) if gate_file else _need(artifacts, "gate_verdict", "rollout")},
        }
    )
    state_dir = config.work_dir / "rollout"
    with controller_lock(state_dir) as held:
        if not held:
            raise StageFailed(f"{state_dir}: another controller is running this rollout")
        controller = open_controller(rollout, state_dir, registry=open_registry(config.registry))
        state = controller.run(config.rollout.poll_interval)
    produced = ReleaseArtifacts(rollout_state=state_dir, rollout_report=state.report_ref)
    if state.phase.value != "promoted":
        raise StageFailed(
            f"rollout ended {state.phase.value}: {state.reason} (audit: {state_dir}/audit.jsonl)"
        )
    return produced


# ---------------------------------------------------------------------------------------------- pipeline
def load_report(work_dir: Path) -> ReleaseReport | None:
    path = Path(work_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        return ReleaseReport.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ReleaseError(f"{path}: unreadable release state: {exc}") from exc


def run_release(
    config: ReleaseConfig,
    *,
    resume: bool = True,
    on_stage: Callable[[StageRecord], None] | None = None,
) -> ReleaseReport:
    """Run the configured stages in order, stopping at the first failure; returns the report.

    With ``resume``, a ``work_dir`` holding an earlier run of the same ``release_id`` and ``base`` keeps the
    stages that passed (and their artifacts) and runs the rest.
    """
    earlier = load_report(config.work_dir) if resume else None
    if earlier is not None and (earlier.release_id, earlier.base) != (config.release_id, config.base):
        raise ReleaseError(
            f"{config.work_dir} holds release {earlier.release_id} of {earlier.base}; "
            f"pass --release-id {earlier.release_id} to resume it, --no-resume to start over, or another --work-dir"
        )
    done = {r.stage: r for r in earlier.stages if r.status == "passed"} if earlier else {}
    report = ReleaseReport(release_id=config.release_id, base=config.base, stages=[], artifacts=config.inputs)
    stopped = False
    for name, function in STAGES.items():
        record = StageRecord(stage=name)
        if name not in config.stages:
            record.status, record.detail = "skipped", "not in --stages"
        elif name in done:
            record = done[name].model_copy(update={"detail": "passed in an earlier run; not run again"})
            report.artifacts = report.artifacts.merged(record.artifacts)
        elif stopped:
            record.detail = "an earlier stage failed"
        else:
            record = _run_stage(name, function, config, report.artifacts)
            report.artifacts = report.artifacts.merged(record.artifacts)
            stopped = record.status == "failed"
        report.stages.append(record)
        _save(config.work_dir, report)
        if on_stage is not None:
            on_stage(record)
    return report


def _run_stage(
    name: StageName, function: StageFunction, config: ReleaseConfig, artifacts: ReleaseArtifacts
) -> StageRecord:
    started = time.monotonic()
    record = StageRecord(stage=name, started_at=datetime.now(UTC).isoformat())
    log.info("release.stage name=%s status=started release=%s", name, config.release_id)
    try:
        record.artifacts = function(config, artifacts.model_copy())
        record.status = "passed"
    except TandemError as exc:
        record.status, record.detail = "failed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # any crash of a stage stops the release with its reason, not a traceback
        record.status, record.detail = "failed", f"{type(exc).__name__}: {exc}"
        log.error("release.stage name=%s crashed:\n%s", name, traceback.format_exc())
    record.seconds = round(time.monotonic() - started, 2)
    log.info("release.stage name=%s status=%s seconds=%.1f", name, record.status, record.seconds)
    return record


def _save(work_dir: Path, report: ReleaseReport) -> None:
    atomic_write_text(Path(work_dir) / STATE_FILE, report.model_dump_json(indent=2))
