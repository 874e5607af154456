"""``distill_draft``: teacher ref in, a distilled draft artifact (kind="draft") in the registry out."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distill.acceptance import AcceptanceReport, build_eval_batches, measure_cost_ratio
from distill.config import DistillConfig, Divergence
from distill.curves import plot_training_curves
from distill.draft_init import (
    build_layer_subset_draft,
    check_same_tokenizer,
    copy_tokenizer_files,
    spread_layers,
)
from distill.prompts import load_prompts
from distill.publish import publish_draft
from distill.speculation import choose_num_speculative_tokens
from distill.training import DraftDistiller, TrainingHistory, has_checkpoint
from infra.config import config_digest, write_json
from infra.errors import ArtifactNotFound
from infra.manifest import ArtifactManifest
from infra.registry import Registry, open_registry

log = logging.getLogger(__name__)

CURVE_NAME = "distill_curve.png"
REPORT_NAME = "distill_report.json"


def default_work_dir(config: DistillConfig) -> Path:
    import os

    home = Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser()
    digest = config_digest(config, include=set(config.config_digest()))[:10]
    return home / "distill" / f"{config.teacher.replace('@', '-')}-{digest}"


def _resolve_dir(registry: Registry, ref_or_path: str) -> Path:
    path = Path(ref_or_path).expanduser()
    if path.is_dir():
        return path
    return registry.fetch(ref_or_path)


#: progress(stage, done, total, status): the CLI draws it; library code never prints.
Progress = Callable[[str, int, int, str], None]


def _no_progress(stage: str, done: int, total: int, status: str) -> None:
    """The default progress callback: nothing (steps are logged anyway)."""


def _train_run(
    distiller: DraftDistiller,
    run_dir: Path,
    divergence: Divergence,
    until_step: int,
    *,
    label: str,
    progress: Progress,
) -> AcceptanceReport:
    """Train ``distiller`` to ``until_step`` with periodic evaluation and checkpoints; resumable."""
    config = distiller.config
    last_report: AcceptanceReport | None = None
    # "resumed ..." is how the CLI learns a run picked up a checkpoint (it prints that line once).
    progress(
        f"distill {label}",
        distiller.step,
        until_step,
        f"resumed at step {distiller.step}" if distiller.step else "",
    )
    while distiller.step < until_step:
        loss = distiller.train_step(divergence)
        status = f"loss={loss:.3f}"
        if distiller.step % config.eval_every == 0 or distiller.step == until_step:
            last_report = distiller.evaluate()
            status += f" acc={last_report.expected_acceptance:.3f}"
        if distiller.step % config.checkpoint_every == 0 or distiller.step == until_step:
            distiller.save_checkpoint(run_dir, {"divergence": divergence})
        progress(f"distill {label}", distiller.step, until_step, status)
        log.info("event=distill_step run=%s step=%d %s", label.replace(" ", "-"), distiller.step, status)
    if last_report is None or distiller.history.evaluations[-1][0] != distiller.step:
        last_report = distiller.evaluate()
    return last_report


def distill_draft(
    config: DistillConfig, *, registry: Registry | None = None, progress: Progress | None = None
) -> ArtifactManifest:
    """Build a draft for ``config.teacher`` and distill it on-policy; publish it (kind="draft") and return it.

    The draft shares the teacher's tokenizer and embeddings and starts from a subset of its layers (or from
    ``config.init_from``, refused before training if its tokenizer differs). Work is checkpointed under
    ``config.work_dir``: calling again with the same config resumes where it stopped. The chosen
    ``num_speculative_tokens`` and the measured acceptance and cost ratio go into the manifest's metadata.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if config.threads:
        torch.set_num_threads(config.threads)
    registry = registry or open_registry(config.registry_url)
    teacher_manifest = registry.manifest(config.teacher)
    teacher_dir = registry.fetch(teacher_manifest.ref)
    work_dir = Path(config.work_dir or default_work_dir(config)).expanduser()
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(work_dir / "config.json", config.model_dump(mode="json"))

    # 1. The initial draft, checked against the teacher's tokenizer before any training.
    if config.init_from:
        init_dir = _resolve_dir(registry, config.init_from)
        check_same_tokenizer(teacher_dir, init_dir)
        keep_layers: list[int] | None = None
    else:
        total_layers = int(AutoConfig.from_pretrained(teacher_dir).num_hidden_layers)
        keep_layers = config.keep_layers or spread_layers(total_layers, config.num_layers)
        init_dir = work_dir / "init"
        if not (init_dir / "config.json").is_file():
            build_layer_subset_draft(teacher_dir, init_dir, keep_layers)
        check_same_tokenizer(teacher_dir, init_dir)

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    teacher_dtype = teacher.dtype

    def fresh_draft() -> Any:
        return AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)

    train_prompts = load_prompts(config.prompts_file, "train")
    heldout = load_prompts(config.prompts_file, "heldout")[: config.eval_prompts]
    eval_batches = build_eval_batches(
        teacher,
        tokenizer,
        heldout,
        new_tokens=config.eval_new_tokens,
        max_prompt_tokens=config.max_prompt_tokens,
    )

    def new_distiller() -> DraftDistiller:
        return DraftDistiller(config, teacher, fresh_draft(), tokenizer, train_prompts, eval_batches)

    # 2. Acceptance of the undistilled draft.
    before_path = work_dir / "before.json"
    if before_path.is_file():
        before = AcceptanceReport.model_validate_json(before_path.read_text())
    else:
        before = new_distiller().evaluate()
        write_json(before_path, before.model_dump())

    # 3. Divergence sweep (short runs from the same init), then the main run continues the winner.
    histories: dict[str, TrainingHistory] = {}
    sweep: dict[Divergence, float] = {}
    main_dir = work_dir / "main"
    if config.divergence == "auto":
        for candidate in config.divergence_candidates:
            run_dir = work_dir / f"sweep-{candidate}"
            result_path = run_dir / "result.json"
            if result_path.is_file():  # finished earlier: reuse its measurement instead of re-evaluating
                finished = json.loads(result_path.read_text())
                report = AcceptanceReport.model_validate(finished["acceptance"])
                histories[f"sweep {candidate}"] = TrainingHistory.from_json(finished["history"])
                sweep[candidate] = report.expected_acceptance
                continue
            distiller = new_distiller()
            if has_checkpoint(run_dir):
                distiller.load_checkpoint(run_dir)
            report = _train_run(
                distiller,
                run_dir,
                candidate,
                config.sweep_steps,
                label=f"sweep {candidate}",
                progress=progress or _no_progress,
            )
            histories[f"sweep {candidate}"] = distiller.history
            sweep[candidate] = report.expected_acceptance
            write_json(
                result_path, {"acceptance": report.model_dump(), "history": distiller.history.to_json()}
            )
            del distiller
        divergence: Divergence = max(sweep, key=sweep.__getitem__)
        log.info("event=distill_divergence_chosen divergence=%s sweep=%s", divergence, sweep)
        if not has_checkpoint(main_dir):
            main_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work_dir / f"sweep-{divergence}" / "checkpoint.pt", main_dir / "checkpoint.pt")
    else:
        divergence = config.divergence
    distiller = new_distiller()
    if has_checkpoint(main_dir):
        distiller.load_checkpoint(main_dir)
    after = _train_run(
        distiller,
        main_dir,
        divergence,
        max(config.steps, distiller.step),
        label=f"main {divergence}",
        progress=progress or _no_progress,
    )
    histories[f"main {divergence}"] = distiller.history

    # 4. Cost ratio and k.
    draft = distiller.draft.eval()
    draft_dir = work_dir / "draft"
    if draft_dir.exists():
        shutil.rmtree(draft_dir)
    draft.to(teacher_dtype).save_pretrained(draft_dir, safe_serialization=True)
    copy_tokenizer_files(init_dir, draft_dir)
    if (init_dir / "draft_origin.json").is_file():
        shutil.copy2(init_dir / "draft_origin.json", draft_dir / "draft_origin.json")
    cost_ratio = config.cost_ratio if config.cost_ratio is not None else measure_cost_ratio(teacher, draft)
    choice = choose_num_speculative_tokens(
        after.expected_acceptance, cost_ratio, config.max_speculative_tokens
    )

    summary = {
        "teacher": teacher_manifest.ref,
        "keep_layers": keep_layers,
        "init_from": config.init_from,
        "divergence": divergence,
        "divergence_sweep": sweep,
        "steps": distiller.step,
        "acceptance_before": before.model_dump(),
        "acceptance_after": after.model_dump(),
        "cost_ratio": cost_ratio,
        "cost_ratio_source": "config"
        if config.cost_ratio is not None
        else "measured: HF decode step, batch 1",
        "speculation": choice.model_dump(),
        "history": {label: history.to_json() for label, history in histories.items()},
    }
    write_json(draft_dir / REPORT_NAME, summary)
    plot_training_curves(histories, draft_dir / CURVE_NAME, chosen=f"main {divergence}")
    shutil.copy2(draft_dir / CURVE_NAME, work_dir / CURVE_NAME)

    metadata = {
        "num_speculative_tokens": choice.num_speculative_tokens,
        "speculative_config": {
            "method": "draft_model",
            "num_speculative_tokens": choice.num_speculative_tokens,
        },
        "acceptance_before": before.expected_acceptance,
        "acceptance_after": after.expected_acceptance,
        "greedy_agreement_before": before.greedy_agreement,
        "greedy_agreement_after": after.greedy_agreement,
        "cost_ratio": cost_ratio,
        "expected_speedup": choice.expected_speedup,
        "divergence": divergence,
        "keep_layers": keep_layers,
        "teacher": teacher_manifest.ref,
        "curve": CURVE_NAME,
    }
    log.info(
        "event=distill_done teacher=%s acceptance_before=%.4f acceptance_after=%.4f cost_ratio=%.3f k=%d",
        teacher_manifest.ref,
        before.expected_acceptance,
        after.expected_acceptance,
        cost_ratio,
        choice.num_speculative_tokens,
    )
    return publish_draft(
        registry,
        draft_dir,
        teacher=teacher_manifest,
        config=config,
        name=config.name,
        version=config.version,
        suffix="-draft",
        produced_by="tandem distill",
        metadata=metadata,
        publish=config.publish,
    )


def latest_draft_for(registry: Registry, teacher_ref: str) -> ArtifactManifest | None:
    """The newest draft artifact whose lineage names ``teacher_ref`` (resolved to name@version) as a parent."""
    try:
        resolved = registry.manifest(teacher_ref).ref
    except ArtifactNotFound:
        return None
    drafts = [m for m in registry.list(kind="draft") if resolved in m.lineage.parents]
    return max(drafts, key=lambda m: m.created_at) if drafts else None
