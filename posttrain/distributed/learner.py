"""The GRPO learner on Ray Train: a ``TorchTrainer`` whose workers (DDP, FSDP by config) take each step's
rollouts from a :class:`StepChannel` actor, apply one policy-gradient update, and publish the new weights for
the rollout engines (rank 0 writes them, plus a checkpoint every ``save_steps``).

Why not TRL's ``GRPOTrainer`` inside the Train workers: it generates its own rollouts (HF ``generate`` or a
vLLM it owns, whose weight sync is CUDA-only) and cannot take rollouts made elsewhere. The loss here is
TRL's ``dapo`` loss (token-level sum over the global batch, two-sided clip, truncated importance sampling
against the sampling engine's log-probabilities, optional k3 KL), written against TRL's own
``selective_log_softmax`` and ``entropy_from_logits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

OPTIMIZER_NAME = "optimizer.pt"


class LearnerConfig(BaseModel):
    """The distributed learner: how many Ray Train workers, how they shard the model, what they reserve."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(1, ge=1, description="Ray Train workers (data-parallel ranks).")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="How the ranks hold the model: DDP replicas or FSDP shards."
    )
    cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPUs reserved by each worker.")
    micro_batch_size: int = Field(
        2,
        ge=1,
        description="Sequences per forward/backward pass on one rank (gradient accumulation). Activations "
        "cost ~1.35 GB per 832-token sequence for the bundled 135M model in float32 (measured).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, ~30% more compute."
    )
    epsilon_low: float = Field(0.2, ge=0, description="Lower clip of the policy ratio (TRL's epsilon).")
    epsilon_high: float = Field(
        0.28, ge=0, description="Upper clip of the policy ratio (DAPO's clip-higher)."
    )
    importance_sampling_cap: float = Field(
        2.0,
        gt=0,
        description="Truncation of the per-token importance weight exp(learner - sampler log-prob), which "
        "corrects both a stale policy (asynchronous rollout) and the engine/learner numeric gap.",
    )


class LearnerSpec(BaseModel):
    """Everything one learner run needs (sent to every Train worker)."""

    start_dir: str
    reference_dir: str
    start_step: int
    max_steps: int
    optimizer_state: str | None = None
    learning_rate: float
    max_grad_norm: float
    temperature: float
    top_k: int | None = None
    beta: float
    dtype: Literal["float32", "bfloat16"]
    seed: int
    save_steps: int
    run_dir: str
    weights_dir: str
    learner: LearnerConfig


def grpo_loss(
    logps: Any,
    behaviour_logps: Any,
    advantages: Any,
    mask: Any,
    normalizer: float,
    config: LearnerConfig,
    beta: float = 0.0,
    reference_logps: Any | None = None,
) -> tuple[Any, dict[str, float]]:
    """TRL's ``dapo`` GRPO loss for one micro-batch with vLLM importance-sampling correction.

    One update per batch, so the "old" policy is the learner's own detached log-probs (ratio 1, gradient of
    log pi); the sampler's log-probs enter only through the truncated importance weight. ``normalizer`` is the
    number of completion tokens of the whole global batch divided by the number of ranks, so the summed
    loss over micro-batches and ranks (DDP averages gradients) is the token mean of the global batch, the same
    whatever the rank count."""
    import torch

    old = logps.detach()
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - config.epsilon_low, 1 + config.epsilon_high)
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    weight = torch.clamp(torch.exp(old - behaviour_logps), max=config.importance_sampling_cap)
    per_token = per_token * weight
    kl = torch.zeros_like(per_token)
    if beta and reference_logps is not None:
        kl = torch.exp(reference_logps - logps) - (reference_logps - logps) - 1
        per_token = per_token + beta * kl
    loss = (per_token * mask).sum() / normalizer
    tokens = float(mask.sum())
    stats = {
        "tokens": tokens,
        "is_weight_sum": float((weight * mask).sum()),
        "is_truncated": float(
            ((torch.exp(old - behaviour_logps) > config.importance_sampling_cap) * mask).sum()
        ),
        "logp_gap_sum": float(((old - behaviour_logps).abs() * mask).sum()),
        "kl_sum": float((kl.detach() * mask).sum()),
    }
    return loss, stats


def completion_logps(
    model: Any,
    sequences: list[dict[str, Any]],
    temperature: float,
    with_entropy: bool,
    top_k: int | None = None,
) -> tuple[Any, Any, Any, Any]:
    """Per completion token: the model's log-prob of the sampled token under the distribution the engines sample
    from (logits / temperature, then the ``top_k`` likeliest tokens renormalised, as vLLM's processed
    log-probs are), the entropy there, and the right-padded mask (a sequence's ``loss_mask`` where it has one:
    an episode's tool turns are not the policy's); plus the padded behaviour log-probs.

    With ``top_k`` the policy is the truncated one on both sides, so the importance weight compares like with
    like (full-vocabulary log-probs against truncated ones would put it near 0 and stall learning). A sampled
    token no longer among the learner's top k has probability 0 under the current policy: it leaves the mask,
    as a zero importance weight would take it out of the loss."""
    import torch
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    device = next(model.parameters()).device
    # Prompts left-padded to one column, completions right-padded after it: every completion token sits in the
    # last ``longest + 1`` positions, so only those logits are computed (``logits_to_keep``), not a
    # [batch, sequence, vocabulary] tensor (GBs for long prompts). Positions count from each row's first real
    # token, as the engine numbers them.
    prompt_width = max(len(s["prompt_ids"]) for s in sequences)
    longest = max(len(s["completion_ids"]) for s in sequences)
    width = prompt_width + longest
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    targets = torch.zeros((len(sequences), longest), dtype=torch.long)
    mask = torch.zeros((len(sequences), longest))
    behaviour = torch.zeros((len(sequences), longest))
    for row, sequence in enumerate(sequences):
        prompt, completion = list(sequence["prompt_ids"]), list(sequence["completion_ids"])
        start, count = prompt_width - len(prompt), len(completion)
        input_ids[row, start : prompt_width + count] = torch.tensor(prompt + completion)
        attention[row, start : prompt_width + count] = 1
        targets[row, :count] = torch.tensor(completion)
        # Multi-turn episodes mask out the tokens the template and the environment added between turns.
        mask[row, :count] = torch.tensor(sequence.get("loss_mask") or [1] * count, dtype=torch.float32)[
            :count
        ]
        behaviour[row, :count] = torch.tensor(sequence["logprobs"][:count], dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        logits_to_keep=longest + 1,
    ).logits
    # The logits at column t predict token t + 1: completion token j (column prompt_width + j) is predicted
    # at prompt_width - 1 + j, i.e. the kept positions but the last.
    logits = logits[:, :longest].float() / temperature
    targets = targets.to(device)
    mask = mask.to(device)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits.detach(), top_k, dim=-1).values[..., -1:]
        kept = logits.detach() >= kth
        # A finite floor, not -inf: probability 0 without 0 * inf = NaN in the entropy and the gradients.
        logits = logits.masked_fill(~kept, torch.finfo(logits.dtype).min)
        mask = mask * torch.gather(kept, -1, targets.unsqueeze(-1)).squeeze(-1).to(mask.dtype)
    logps = selective_log_softmax(logits, targets)
    entropy = entropy_from_logits(logits.detach()) if with_entropy else torch.zeros_like(logps)
    return logps, entropy, mask, behaviour.to(device)


def _full_state_dict(model: Any, strategy: str) -> dict[str, Any]:
    """The whole model's weights on every rank (a collective call under FSDP)."""
    if strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return dict(
            get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        )
    module = getattr(model, "module", model)
    return {name: tensor.detach() for name, tensor in module.state_dict().items()}


def learner_loop(loop_config: dict[str, Any]) -> None:
    """The body of each Ray Train worker: one GRPO update per step, until ``max_steps`` or the channel closes."""
    import ray
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from posttrain.distributed.engines import save_weights_for_engines

    spec = LearnerSpec.model_validate(loop_config["spec"])
    channel = loop_config["channel"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(spec.seed)
    dtype = torch.float32 if spec.dtype == "float32" else torch.bfloat16
    model: Any = AutoModelForCausalLM.from_pretrained(spec.start_dir, dtype=dtype)
    reference = None
    if spec.beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(spec.reference_dir, dtype=dtype).eval()
        reference.requires_grad_(False)
    module = model
    if spec.learner.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = ray.train.torch.prepare_model(model, parallel_strategy=spec.learner.strategy)
    if reference is not None:
        reference.to(ray.train.torch.get_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    # TRL's default schedule: linear decay to 0 over the run.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, 1.0 - step / max(spec.max_steps, 1))
    )
    if spec.optimizer_state:
        saved = torch.load(spec.optimizer_state, map_location="cpu", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
    weights_dir = Path(spec.weights_dir)
    for step in range(spec.start_step, spec.max_steps):
        waited = time.monotonic()
        shard = ray.get(channel.take.remote(step, rank))
        if shard is None:
            log.info("event=learner_stopped rank=%d step=%d", rank, step)
            return
        idle = time.monotonic() - waited
        started = time.monotonic()
        model.train()
        optimizer.zero_grad(set_to_none=True)
        sequences = shard["sequences"]
        normalizer = max(shard["global_tokens"], 1) / world
        size = spec.learner.micro_batch_size
        chunks = [sequences[i : i + size] for i in range(0, len(sequences), size)]
        totals = dict.fromkeys(
            ("loss", "tokens", "entropy_sum", "is_weight_sum", "is_truncated", "logp_gap_sum", "kl_sum"), 0.0
        )
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            syncing = last or not hasattr(model, "no_sync")
            with model.no_sync() if not syncing else contextlib.nullcontext():
                logps, entropy, mask, behaviour = completion_logps(
                    model, chunk, spec.temperature, True, spec.top_k
                )
                reference_logps = None
                if reference is not None:
                    with torch.no_grad():
                        reference_logps = completion_logps(
                            reference, chunk, spec.temperature, False, spec.top_k
                        )[0]
                advantages = torch.tensor(
                    [s["advantage"] for s in chunk], dtype=logps.dtype, device=logps.device
                )
                loss, stats = grpo_loss(
                    logps, behaviour, advantages, mask, normalizer, spec.learner, spec.beta, reference_logps
                )
                loss.backward()
            totals["loss"] += float(loss.detach())
            totals["entropy_sum"] += float((entropy * mask).sum())
            for key, value in stats.items():
                totals[key] += value
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), spec.max_grad_norm))
        optimizer.step()
        schedule.step()
        summed = torch.tensor([totals[k] for k in totals], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(summed)
        reduced = dict(zip(totals, summed.tolist(), strict=True))
        tokens = max(reduced["tokens"], 1.0)
        stats_out = {
            "loss": reduced["loss"] / world,  # each rank's share is scaled by world (see grpo_loss)
            "tokens": reduced["tokens"],
            "grad_norm": grad_norm if math.isfinite(grad_norm) else float("inf"),
            "entropy": reduced["entropy_sum"] / tokens,
            "is_weight": reduced["is_weight_sum"] / tokens,
            "is_truncated_fraction": reduced["is_truncated"] / tokens,
            "logp_gap": reduced["logp_gap_sum"] / tokens,
            "kl": reduced["kl_sum"] / tokens,
            "learning_rate": float(schedule.get_last_lr()[0]),
            "learner_seconds": time.monotonic() - started,
            "learner_idle_seconds": idle,
        }
        version = step + 1
        state = _full_state_dict(model, spec.learner.strategy)
        if rank == 0:
            weights = save_weights_for_engines(
                _engine_copy(module, state, spec.learner.strategy),
                weights_dir / f"policy-{version}.safetensors",
            )
            checkpoint = None
            if version % spec.save_steps == 0 or version == spec.max_steps or shard.get("final"):
                checkpoint = Path(spec.run_dir) / f"checkpoint-{version}"
                checkpoint.mkdir(parents=True, exist_ok=True)
                module.save_pretrained(checkpoint, state_dict=state)
                torch.save(
                    {"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()},
                    checkpoint / OPTIMIZER_NAME,
                )
            info = {"weights": str(weights), "checkpoint": str(checkpoint) if checkpoint else None}
            ray.get(channel.publish.remote(version, info | {"stats": stats_out}))
        if world > 1:
            dist.barrier()  # rank 0's files are complete before any rank moves on
        if shard.get("final"):  # the driver's time budget is spent: this step was the run's last
            log.info("event=learner_final rank=%d step=%d", rank, version)
            return


def _engine_copy(module: Any, state: dict[str, Any], strategy: str) -> Any:
    """A module holding the full weights to write for the engines: the rank's own (DDP replicas hold them
    all), or a copy loaded with the gathered state (FSDP ranks hold shards)."""
    if strategy == "ddp":
        return module
    clone = copy.deepcopy(module)
    clone.load_state_dict(state)
    return clone


class StepChannel:
    """The meeting point of the driver and the learner ranks (an async Ray actor): the driver puts each step's
    shards, every rank takes its own; rank 0 publishes each new policy version, the driver waits for them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.shards: dict[int, list[dict[str, Any] | None]] = {}
        self.published: list[tuple[int, dict[str, Any]]] = []
        self.closed = False
        self.changed = asyncio.Condition()

    async def put(self, step: int, shards: list[dict[str, Any]]) -> None:
        if len(shards) != self.world:
            raise ValueError(f"step {step}: {len(shards)} shards for {self.world} learner ranks")
        async with self.changed:
            self.shards[step] = list(shards)
            self.changed.notify_all()

    async def take(self, step: int, rank: int) -> dict[str, Any] | None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.closed or step in self.shards)
            if step not in self.shards:
                return None
            shard = self.shards[step][rank]
            self.shards[step][rank] = None
            if all(item is None for item in self.shards[step]):
                del self.shards[step]
            return shard

    async def publish(self, version: int, info: dict[str, Any]) -> None:
        async with self.changed:
            self.published.append((version, info))
            self.changed.notify_all()

    async def wait_published(self, after: int, timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
        """Versions newer than ``after`` (waits up to ``timeout_s`` for the first)."""
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: any(v > after for v, _ in self.published)), timeout_s
                )
            except TimeoutError:
                pass
            return [(v, info) for v, info in self.published if v > after]

    async def close(self) -> None:
        async with self.changed:
            self.closed = True
            self.changed.notify_all()
