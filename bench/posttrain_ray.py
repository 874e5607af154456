"""``tandem bench posttrain``: post-training on Ray, measured on the bundled model, one phase after another.

1. **Rollout**: the same prompts (the RL pool's own, chat-formatted), ``num_generations`` samples each,
   exactly ``max_tokens`` tokens per sample (EOS ignored on both sides, so the token counts are equal), from
   a vLLM rollout engine (:mod:`posttrain.distributed.engines`) and from Hugging Face ``generate`` (the
   single-process GRPO path's sampler). Engine start is reported, not counted.
2. **Learner**: one GRPO update on the vLLM rollouts (advantages +-1), with 1 and with 2 DDP ranks of Ray
   Train (:func:`posttrain.distributed.learner.learner_loop`), median over ``learner_steps`` steps.
3. **GRPO step**: whole GRPO runs on Ray (engines, scheduler, learner), synchronous (``max_staleness`` 0) and
   one step off-policy (1): wall time per step (between the learner's published steps, the first left out)
   and the learner's idle fraction (time rank 0 waited for a batch over its step time plus that wait).
"""

from __future__ import annotations

import itertools
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.lifecycle import init_ray

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


class PosttrainBenchConfig(BaseModel):
    """Every knob of ``tandem bench posttrain``."""

    model: str = Field("smollm2-135m-instruct@base", description="Registry ref (or directory) of the policy.")
    family: str = Field("documents", description="Task family whose prompts are sampled.")
    prompts: int = Field(8, ge=1, description="Prompts of the rollout phase.")
    num_generations: int = Field(4, ge=2, description="Samples per prompt (one GRPO group).")
    max_tokens: int = Field(64, ge=8, description="Tokens per sample, EOS ignored.")
    max_prompt_tokens: int = Field(512, ge=64, description="Prompts longer than this are skipped.")
    learner_sequences: int = Field(16, ge=2, description="Rollouts in one learner step (the first ones).")
    learner_steps: int = Field(3, ge=2, description="Learner steps per rank count (the first is warm-up).")
    grpo_steps: int = Field(4, ge=3, description="GRPO steps per synchronous / asynchronous run.")
    grpo_batch: int = Field(2, ge=1, description="Prompts per GRPO step.")
    engine_cpus: float = Field(1.0, gt=0, description="Ray CPUs per rollout engine.")
    registry_url: str | None = None
    results_dir: Path = RESULTS_DIR


def run_posttrain_bench(
    config: PosttrainBenchConfig, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Run the three phases (see the module docstring) and write JSON + a markdown table."""
    import ray

    work = Path(tempfile.mkdtemp(prefix="tandem-bench-posttrain-"))
    rl = _rl_config(config, work, max_staleness=1)
    init_ray(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        from posttrain.common import StageContext

        context = StageContext(rl, "rl")
        tokenizer = context.load_tokenizer()
        prompts = _prompts(context, tokenizer, config)
        progress(
            f"rollout: {len(prompts)} prompts x {config.num_generations} x {config.max_tokens} tokens, vLLM"
        )
        rollout = {"vllm": _vllm_rollout(context.base_dir, prompts, config)}
        progress("rollout: Hugging Face generate")
        rollout["hf_generate"] = _hf_rollout(context.base_dir, prompts, config)
        rollout["speedup"] = rollout["vllm"]["tokens_per_s"] / rollout["hf_generate"]["tokens_per_s"]
        sequences = rollout["vllm"].pop("sequences")
        learner = {}
        for workers in (1, 2):
            progress(f"learner: {workers} DDP rank(s)")
            learner[f"ranks_{workers}"] = _learner_steps(context.base_dir, sequences, workers, config, work)
        learner["speedup_2_over_1"] = (
            learner["ranks_1"]["median_step_s"] / learner["ranks_2"]["median_step_s"]
        )
        grpo = {}
        for staleness in (0, 1):
            progress(f"GRPO: {config.grpo_steps} steps, max_staleness {staleness}")
            grpo[f"staleness_{staleness}"] = _grpo(_rl_config(config, work / f"s{staleness}", staleness))
        grpo["async_speedup"] = grpo["staleness_0"]["median_step_s"] / grpo["staleness_1"]["median_step_s"]
    finally:
        ray.shutdown()
    summary = {
        "benchmark": "posttrain",
        "timestamp": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "config": json.loads(config.model_dump_json(exclude={"results_dir"})),
        "machine": _machine(),
        "rollout": rollout,
        "learner": learner,
        "grpo": grpo,
    }
    config.results_dir.mkdir(parents=True, exist_ok=True)
    path = config.results_dir / f"posttrain-{summary['timestamp']}.json"
    path.write_text(json.dumps(summary, indent=2))
    (config.results_dir / "posttrain-latest.json").write_text(json.dumps(summary, indent=2))
    (config.results_dir / "posttrain-latest.md").write_text(markdown_table(summary))
    summary["results_file"] = str(path)
    return summary


def _rl_config(config: PosttrainBenchConfig, work: Path, max_staleness: int) -> Any:
    from posttrain.stages import RLRunConfig

    output: dict[str, Any] = {"work_dir": str(work), "publish": False}
    if config.registry_url:
        output["registry"] = config.registry_url
    return RLRunConfig.model_validate({
        "base": config.model,
        "pool": {"families": [config.family], "instances_per_family": 64, "seed": 0},
        "num_generations": config.num_generations,
        "max_completion_length": config.max_tokens,
        "train": {"max_steps": config.grpo_steps, "batch_size": config.grpo_batch, "learning_rate": 1e-6,
                  "save_steps": 1000, "seed": 0, "max_length": config.max_prompt_tokens + config.max_tokens},
        "evaluate_before_after": False,
        "output": output,
        "ray": {"engines": 1, "engine": {"num_cpus": config.engine_cpus}, "max_staleness": max_staleness,
                "learner": {"workers": 1, "cpus_per_worker": 1.0}},
    })  # fmt: skip


def _prompts(context: Any, tokenizer: Any, config: PosttrainBenchConfig) -> list[list[int]]:
    from posttrain.formats import format_for

    prompts: list[list[int]] = []
    for instance in context.pool.instances.values():
        messages = format_for(instance.family).messages(instance)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False).input_ids)
        if len(ids) <= config.max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == config.prompts:
            return prompts
    if not prompts:
        raise ValueError(f"no {config.family} prompt fits in {config.max_prompt_tokens} tokens")
    return prompts


def _vllm_rollout(model_dir: Path, prompts: list[list[int]], config: PosttrainBenchConfig) -> dict[str, Any]:
    import ray

    from posttrain.distributed.engines import RolloutEngineConfig, start_engines

    started = time.monotonic()
    engine_config = RolloutEngineConfig(num_cpus=config.engine_cpus)
    (handle,) = start_engines(model_dir, engine_config, 1, prefix="bench").values()
    start_s = time.monotonic() - started
    sampling = {
        "n": config.num_generations,
        "temperature": 1.0,
        "max_tokens": config.max_tokens,
        "min_tokens": config.max_tokens,
    }
    ray.get(handle.generate.remote(prompts[:1], sampling | {"n": 1, "max_tokens": 8, "min_tokens": 8}, 0))
    started = time.monotonic()
    groups = ray.get(handle.generate.remote(prompts, sampling, 1))
    seconds = time.monotonic() - started
    ray.get(handle.shutdown.remote())
    ray.kill(handle)
    tokens = sum(len(c["token_ids"]) for group in groups for c in group)
    sequences = [
        {
            "prompt_ids": prompt,
            "completion_ids": c["token_ids"],
            "logprobs": c["logprobs"],
            "advantage": 1.0 if index % 2 else -1.0,
        }
        for prompt, group in zip(prompts, groups, strict=True)
        for index, c in enumerate(group)
    ]
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "engine_start_s": start_s,
        "sequences": sequences,
    }


def _hf_rollout(model_dir: Path, prompts: list[list[int]], config: PosttrainBenchConfig) -> dict[str, Any]:
    """Batched sampling with ``generate`` (left padding), as the single-process GRPO trainer samples."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    with torch.no_grad():
        model.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=8, do_sample=True, pad_token_id=pad)
        started = time.monotonic()
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            num_return_sequences=config.num_generations,
            max_new_tokens=config.max_tokens,
            min_new_tokens=config.max_tokens,
            pad_token_id=pad,
        )
        seconds = time.monotonic() - started
    tokens = int(out[:, width:].numel())
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _learner_steps(
    model_dir: Path, sequences: list[dict[str, Any]], workers: int, config: PosttrainBenchConfig, work: Path
) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from posttrain.distributed.learner import LearnerConfig, LearnerSpec, StepChannel, learner_loop

    steps = config.learner_steps
    sequences = sequences[: config.learner_sequences]
    sequences = sequences[: len(sequences) - len(sequences) % workers]
    tokens = sum(len(s["completion_ids"]) for s in sequences)
    channel: Any = ray.remote(num_cpus=0)(StepChannel).options(max_concurrency=16).remote(workers)
    for step in range(steps):
        shards = [{"sequences": sequences[r::workers], "global_tokens": tokens} for r in range(workers)]
        ray.get(channel.put.remote(step, shards))
    spec = LearnerSpec(
        start_dir=str(model_dir),
        reference_dir=str(model_dir),
        start_step=0,
        max_steps=steps,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        temperature=1.0,
        beta=0.0,
        dtype="float32",
        seed=0,
        save_steps=10_000,
        run_dir=str(work / f"learner-{workers}"),
        weights_dir=str(work / f"learner-{workers}-weights"),
        learner=LearnerConfig(workers=workers, cpus_per_worker=1.0),
    )
    TorchTrainer(
        learner_loop,
        train_loop_config={"spec": spec.model_dump(mode="json"), "channel": channel},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1.0}),
        run_config=RunConfig(name=f"bench-learner-{workers}", storage_path=str(work / "ray-train")),
    ).fit()
    published = ray.get(channel.wait_published.remote(0, 5.0))
    seconds = [info["stats"]["learner_seconds"] for _, info in sorted(published, key=lambda p: p[0])]
    return {
        "workers": workers,
        "sequences": len(sequences),
        "completion_tokens": tokens,
        "step_seconds": seconds,
        "median_step_s": statistics.median(seconds[1:]),
    }


def _grpo(rl: Any) -> dict[str, Any]:
    from posttrain.distributed.rl import RayGRPO

    times: list[float] = []
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        times.append(time.monotonic())
        rows.append(row)

    started = time.monotonic()
    RayGRPO(rl, on_progress=record).run(resume=False)
    wall = time.monotonic() - started
    gaps = [b - a for a, b in itertools.pairwise(times)]
    busy = sum(r["learner_seconds"] for r in rows[1:])
    idle = sum(r["learner_idle_seconds"] for r in rows[1:])
    return {
        "max_staleness": rl.ray.max_staleness,
        "steps": len(rows),
        "wall_s": wall,
        "step_seconds": gaps,
        "median_step_s": statistics.median(gaps),
        "learner_idle_fraction": idle / (busy + idle) if busy + idle else 0.0,
        "staleness": [r["staleness"] for r in rows],
        "reward": [r["reward"] for r in rows],
    }


def _machine() -> dict[str, Any]:
    import os
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def markdown_table(summary: dict[str, Any]) -> str:
    rollout, learner, grpo = summary["rollout"], summary["learner"], summary["grpo"]
    config = summary["config"]
    lines = [
        f"Post-training on Ray, {config['model']}, {summary['machine']['cpus']} CPUs, {summary['timestamp']}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| rollout tok/s, vLLM engine ({config['prompts']} prompts x {config['num_generations']} x "
        f"{config['max_tokens']} tokens) | {rollout['vllm']['tokens_per_s']:.1f} |",
        f"| rollout tok/s, HF generate (same prompts) | {rollout['hf_generate']['tokens_per_s']:.1f} |",
        f"| rollout speedup vLLM / HF | **{rollout['speedup']:.2f}x** |",
        f"| vLLM engine start | {rollout['vllm']['engine_start_s']:.1f} s |",
        f"| learner step ({learner['ranks_1']['sequences']} rollouts), 1 DDP rank | "
        f"{learner['ranks_1']['median_step_s']:.2f} s |",
        f"| learner step ({learner['ranks_2']['sequences']} rollouts), 2 DDP ranks | "
        f"{learner['ranks_2']['median_step_s']:.2f} s |",
        f"| learner speedup 2 / 1 ranks | {learner['speedup_2_over_1']:.2f}x |",
        f"| GRPO step, synchronous (max_staleness 0) | {grpo['staleness_0']['median_step_s']:.2f} s |",
        f"| GRPO step, asynchronous (max_staleness 1) | {grpo['staleness_1']['median_step_s']:.2f} s |",
        f"| async speedup | {grpo['async_speedup']:.2f}x |",
        f"| learner idle, synchronous | {100 * grpo['staleness_0']['learner_idle_fraction']:.0f}% |",
        f"| learner idle, asynchronous | {100 * grpo['staleness_1']['learner_idle_fraction']:.0f}% |",
    ]
    return "\n".join(lines) + "\n"
