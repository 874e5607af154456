"""``train_eagle3_head``: teacher ref in, an EAGLE-3 draft head (kind="draft") in the registry out.

Stages, each resumable under the work directory: (1) prompts and the target's own greedy completions,
generated with vLLM batch inference; (2) the draft vocabulary from those completions' token
frequencies; (3) target features at the aux layers, cached on disk; (4) training with the training-time
test unroll, checkpointed; (5) held-out acceptance on prompts never trained on, the choice of k, and the
checkpoint in vLLM's eagle3 format, published with lineage.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distill.eagle3.config import Eagle3Config
from distill.eagle3.curves import CURVE_NAME, plot_head_training
from distill.eagle3.generate import GenerationJob, GenerationSpec, generate
from distill.eagle3.head import Eagle3Head
from distill.eagle3.prompts import clean_user_turn, extra_prompts, self_prompt_requests, training_prompts
from distill.eagle3.task_prompts import task_prompts
from distill.eagle3.training import (
    AcceptanceEstimate,
    FeatureStore,
    HeadTrainer,
    byte_tokens,
    choose_draft_vocab,
    estimate_acceptance,
    init_from_target,
    new_head,
    teacher_head_rows,
    vocab_coverage,
)
from distill.errors import CheckpointError, DistillError
from distill.prompts import load_prompts
from distill.publish import publish_draft
from infra.config import write_json
from infra.manifest import ArtifactManifest
from infra.registry import Registry, open_registry

log = logging.getLogger(__name__)

REPORT_NAME = "eagle3_report.json"
GENERATION_STAGES = {
    "user-turns": "sample user turns",
    "responses": "greedy completions",
    "heldout": "held-out completions",
}
#: progress(stage, done, total, status): the CLI draws it; library code never prints.
Progress = Callable[[str, int, int, str], None]


def _quiet(stage: str, done: int, total: int, status: str) -> None:
    log.debug("event=eagle3_progress stage=%s done=%d total=%d %s", stage, done, total, status)


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when torch sees a GPU, else the CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def default_work_dir(config: Eagle3Config) -> Path:
    home = Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser()
    return home / "distill" / f"eagle3-{config.teacher.replace('@', '-')}-{config.data_digest()}"


def select_training_prompts(config: Eagle3Config, turns: list[str], heldout: list[str]) -> list[str]:
    """The prompts this round answers: the base set (bundled, templates, sampled ``turns``), then the extra
    bank, then the task bank, held-out prompts never among them; ``skip_prompts`` and ``max_prompts`` cut
    that list."""
    prompts = training_prompts(config.template_prompts, turns, config.seed)
    if config.extra_prompts:
        prompts += extra_prompts(config.seed, config.extra_prompts, {*prompts, *heldout})
    if config.task_prompts:
        prompts += task_prompts(config.seed, config.task_prompts, {*prompts, *heldout})
    selected = prompts[config.skip_prompts : config.max_prompts]
    if not selected:
        raise DistillError(
            f"skip_prompts={config.skip_prompts} leaves none of the {len(prompts[: config.max_prompts])} "
            "training prompts; raise extra_prompts or task_prompts (or max_prompts)"
        )
    return selected


def speedup_by_k(per_position: list[float], cost_ratio: float) -> dict[int, float]:
    """Expected single-stream speedup for each k from measured chain acceptance: (1 + sum p_j) / (1 + k c)."""
    return {
        k: round((1 + sum(per_position[:k])) / (1 + k * cost_ratio), 4)
        for k in range(1, len(per_position) + 1)
    }


def measure_head_cost(target: Any, head: Eagle3Head, *, context: int = 64, repeats: int = 24) -> float:
    """Head step / target decode step time, batch 1 (HF with KV cache vs one head position): the c of k*c+1."""
    device = head.fc.weight.device
    ids = torch.randint(3, int(target.config.vocab_size), (1, context), device=device)
    features = torch.randn(1, 1, head.fc.in_features, device=device)
    embeds = torch.randn(1, 1, head.shape.hidden_size, device=device)
    mask = torch.ones(1, 1, dtype=torch.long, device=device)

    def median(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2]

    with torch.no_grad():
        out = target(input_ids=ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

        def target_step() -> None:
            target(input_ids=token, past_key_values=cache, use_cache=True)

        head_cost = median(lambda: head.logits(head(features, embeds, mask, 1)[0]))
        target_cost = median(target_step)
    return head_cost / target_cost


def warm_start_head(
    registry: Registry, config: Eagle3Config, teacher: ArtifactManifest, target_config: Any
) -> tuple[Eagle3Head, str]:
    """The published head ``config.init_from`` (weights and draft vocabulary), checked against the teacher.

    A head of another teacher, target vocabulary, width or aux layers would train on features it was
    never shaped for, so each mismatch is refused by name.
    """
    manifest = registry.manifest(str(config.init_from))
    origin = manifest.metadata.get("teacher")
    if manifest.kind != "draft" or manifest.metadata.get("method") != "eagle3":
        raise DistillError(f"--init-from {manifest.ref}: not an eagle3 draft (kind={manifest.kind})")
    if origin != teacher.ref:
        raise DistillError(f"--init-from {manifest.ref}: drafted for {origin}, not for {teacher.ref}")
    head = Eagle3Head.load_vllm(registry.fetch(manifest.ref))
    shape = head.shape
    expected_layers = config.aux_layers or shape.aux_layers
    checks = {
        "target vocabulary": (shape.target_vocab_size, int(target_config.vocab_size)),
        "hidden size": (shape.hidden_size, int(target_config.hidden_size)),
        "aux layers": (shape.aux_layers, expected_layers),
    }
    for what, (found, wanted) in checks.items():
        if found != wanted:
            raise DistillError(f"--init-from {manifest.ref}: {what} is {found}, this run needs {wanted}")
    if shape.draft_vocab_size > config.draft_vocab_size:
        raise DistillError(
            f"--init-from {manifest.ref}: the head drafts {shape.draft_vocab_size} tokens, this run asks for "
            f"{config.draft_vocab_size} (a draft vocabulary can grow, not shrink)"
        )
    if shape.num_layers > config.head_layers:
        raise DistillError(
            f"--init-from {manifest.ref}: the head has {shape.num_layers} layers, this run asks for "
            f"{config.head_layers} (a head can grow, not shrink)"
        )
    return head.with_layers(config.head_layers), manifest.ref


def train_eagle3_head(
    config: Eagle3Config, *, registry: Registry | None = None, progress: Progress | None = None
) -> ArtifactManifest:
    """Train an EAGLE-3 head for ``config.teacher`` on its own greedy outputs and publish it.

    Calling again with the same config resumes: finished data shards, features and the last checkpoint
    are reused. The manifest's metadata holds the speculative config the fast tier serves with
    (``method: eagle3``, the chosen k), the held-out acceptance and the expected speedup.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or _quiet
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    autocast_dtype = torch.bfloat16 if config.compute_dtype == "bfloat16" else None
    registry = registry or open_registry(config.registry_url)
    teacher_manifest = registry.manifest(config.teacher)
    teacher_dir = registry.fetch(teacher_manifest.ref)
    work_dir = Path(config.work_dir or default_work_dir(config)).expanduser()
    data_dir = work_dir / "data"
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(work_dir / "config.json", config.model_dump(mode="json"))

    # 1. Prompts and the target's greedy completions (vLLM batch inference, resumable shards).
    suffix = config.train_data_suffix()

    def gen_progress(job: str, done: int, total: int) -> None:
        report(GENERATION_STAGES.get(job.removesuffix(suffix), job), done, total, "shards")

    engine = {
        "model": str(teacher_dir),
        "seed": config.seed,
        "dtype": config.generation_dtype,
        "kv_cache_memory_bytes": config.generation_kv_cache_bytes,
        "max_model_len": config.max_seq_len + config.max_new_tokens,
    }
    turns: list[str] = []
    if config.self_prompts:
        user_turns = GenerationJob(
            prompts=self_prompt_requests(config.seed, config.self_prompts),
            out_dir=data_dir / "user-turns",
            temperature=1.0,
            max_tokens=64,
            shard_size=500,
        )
        (sampled,) = generate(GenerationSpec(**engine, jobs=[user_turns]), progress=gen_progress)
        turns = [t for t in (clean_user_turn(row["text"]) for row in sampled) if t]
    heldout_prompts = load_prompts(split="heldout")
    prompts = select_training_prompts(config, turns, heldout_prompts)
    responses = GenerationJob(
        prompts=prompts, out_dir=data_dir / f"responses{suffix}", max_tokens=config.max_new_tokens
    )
    heldout = GenerationJob(
        prompts=heldout_prompts, out_dir=data_dir / "heldout", max_tokens=config.max_new_tokens
    )
    rows, heldout_rows = generate(GenerationSpec(**engine, jobs=[responses, heldout]), progress=gen_progress)
    train_tokens = sum(len(r["output_ids"]) for r in rows)

    # 2. Draft vocabulary.
    target: Any = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    target = target.to(device).eval()
    reserved = byte_tokens(AutoTokenizer.from_pretrained(teacher_dir))
    if config.init_from:
        head, init_ref = warm_start_head(registry, config, teacher_manifest, target.config)
        vocab = head.draft_to_target(torch.arange(head.shape.draft_vocab_size))
        if config.draft_vocab_size > len(vocab):
            vocab, _ = choose_draft_vocab(
                rows, config.draft_vocab_size, int(target.config.vocab_size), reserved, keep=vocab.tolist()
            )
            head = head.with_vocab(vocab, target.get_output_embeddings().weight[vocab])
        coverage = vocab_coverage(rows, vocab.tolist())
    else:
        vocab_path = work_dir / "draft_vocab.json"
        if vocab_path.is_file():
            saved = json.loads(vocab_path.read_text())
            vocab, coverage = torch.tensor(saved["ids"], dtype=torch.long), float(saved["coverage"])
        else:
            vocab, coverage = choose_draft_vocab(
                rows, config.draft_vocab_size, int(target.config.vocab_size), reserved
            )
            write_json(vocab_path, {"ids": vocab.tolist(), "coverage": coverage})
        head = new_head(target.config, vocab, config.aux_layers, config.head_layers)
        init_from_target(head, target)
    head.to(device)

    # 3. Target features at the aux layers.
    stores = {
        "train": FeatureStore(work_dir / "features" / f"train{suffix}"),
        "heldout": FeatureStore(work_dir / "features" / "heldout"),
    }
    for split, split_rows in (("train", rows), ("heldout", heldout_rows)):

        def feature_progress(done: int, total: int, split: str = split) -> None:
            report(f"features {split}", done, total, "shards")

        stores[split].extract(
            target,
            split_rows,
            head.shape.aux_layers,
            max_len=config.max_seq_len,
            shard_rows=256,
            autocast_dtype=autocast_dtype,
            progress=feature_progress,
        )
    train_sequences = stores["train"].load(len(rows))
    heldout_sequences = stores["heldout"].load(len(heldout_rows))
    embed = target.get_input_embeddings()

    # 4. Training (checkpointed; the time budget counts across resumes).
    soft = config.soft_labels and all(e.final is not None for e in train_sequences)
    if config.soft_labels and not soft:
        log.warning("event=eagle3_hard_labels reason='feature store has no last hidden states: re-extract'")
    trainer = HeadTrainer(
        head,
        embed,
        train_sequences,
        steps_ahead=config.speculative_steps,
        epochs=config.epochs,
        tokens_per_batch=config.tokens_per_batch,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        step_weight_decay=config.step_weight_decay,
        seed=config.seed,
        autocast_dtype=autocast_dtype,
        teacher_head=teacher_head_rows(head, target) if soft else None,
    )
    run_dir = work_dir / f"train-{config.train_digest()}"
    if trainer.load(run_dir):
        log.info("event=eagle3_resume step=%d", trainer.state.step)
        report("train head", trainer.state.step, trainer.total_steps, f"resumed at step {trainer.state.step}")
    evaluations: list[dict[str, Any]] = []
    evaluations_path = run_dir / "evaluations.json"
    if evaluations_path.is_file():
        evaluations = json.loads(evaluations_path.read_text())

    def evaluate() -> AcceptanceEstimate:
        estimate = estimate_acceptance(
            head, embed, heldout_sequences, config.speculative_steps, autocast_dtype
        )
        evaluations.append({"step": trainer.state.step, **estimate.model_dump()})
        write_json(evaluations_path, evaluations)
        return estimate

    if not evaluations:
        run_dir.mkdir(parents=True, exist_ok=True)
        evaluate()
    budget = config.time_budget_s
    status = ""
    while not trainer.done and (budget is None or trainer.state.train_seconds < budget):
        record = trainer.train_step()
        status = f"loss={record['loss']:.3f} acc1={record['acc_1']:.3f}"
        if trainer.state.step % config.eval_every == 0:
            status += f" heldout={evaluate().mean_accepted:.3f}"
        if trainer.state.step % config.checkpoint_every == 0:
            trainer.save(run_dir)
        report("train head", trainer.state.step, trainer.total_steps, status)
    trainer.save(run_dir)
    final = (
        evaluate()
        if evaluations[-1]["step"] != trainer.state.step
        else AcceptanceEstimate.model_validate({k: v for k, v in evaluations[-1].items() if k != "step"})
    )

    # 5. Cost, k, export, publish.
    head.eval()
    try:
        cost = config.cost_ratio if config.cost_ratio is not None else measure_head_cost(target, head)
    except RuntimeError as exc:  # a cost we cannot measure must not lose the trained head
        raise CheckpointError(
            f"head trained (checkpoint in {run_dir}) but cost measurement failed: {exc}"
        ) from exc
    table = speedup_by_k(final.per_position[: config.max_speculative_tokens], cost)
    k = max(table, key=lambda n: (table[n], -n))
    draft_dir = work_dir / "draft"
    head.save_vllm(draft_dir)
    summary = {
        "teacher": teacher_manifest.ref,
        "method": "eagle3",
        "train_sequences": len(train_sequences),
        "train_completion_tokens": train_tokens,
        "heldout_sequences": len(heldout_sequences),
        "draft_vocab_size": len(vocab),
        "draft_vocab_coverage": round(coverage, 4),
        "init_from": init_ref if config.init_from else None,
        "aux_layers": head.shape.aux_layers,
        "optimizer_steps": trainer.state.step,
        "epochs_done": round(trainer.state.step / max(1, trainer.per_epoch), 3),
        "train_seconds": round(trainer.state.train_seconds, 1),
        "labels": "soft (target distribution over the draft vocabulary)" if soft else "hard (greedy token)",
        "acceptance": final.model_dump(),
        "evaluations": evaluations,
        "cost_ratio": round(cost, 4),
        "cost_ratio_source": "config"
        if config.cost_ratio is not None
        else "measured: HF batch-1 step vs head step",
        "expected_speedup_by_k": table,
        "num_speculative_tokens": k,
        "parameters": sum(p.numel() for p in head.parameters()),
    }
    write_json(draft_dir / REPORT_NAME, summary)
    plot_head_training(trainer.state.history, evaluations, draft_dir / CURVE_NAME)
    metadata = {
        "method": "eagle3",
        "num_speculative_tokens": k,
        "speculative_config": {"method": "eagle3", "num_speculative_tokens": k},
        "acceptance_rate": final.acceptance_rate,
        "mean_accepted": final.mean_accepted,
        "acceptance_per_position": final.per_position,
        "draft_vocab_size": len(vocab),
        "draft_vocab_coverage": round(coverage, 4),
        "cost_ratio": round(cost, 4),
        "expected_speedup": table[k],
        "train_completion_tokens": train_tokens,
        "teacher": teacher_manifest.ref,
    }
    log.info(
        "event=eagle3_done teacher=%s mean_accepted=%.3f acceptance_rate=%.3f cost=%.3f k=%d",
        teacher_manifest.ref,
        final.mean_accepted,
        final.acceptance_rate,
        cost,
        k,
    )
    return publish_draft(
        registry,
        draft_dir,
        teacher=teacher_manifest,
        config=config,
        name=config.name,
        version=config.version,
        suffix="-eagle3",
        produced_by="tandem distill --method eagle3",
        metadata=metadata,
        publish=config.publish,
        parents=(init_ref,) if config.init_from else (),
    )
