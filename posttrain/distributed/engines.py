"""vLLM rollout engines for post-training on Ray: async Ray actors around vLLM's ``AsyncLLM``, built from the same
:class:`~serving.tiers.EngineConfig` the served tiers use, whose weights the learner replaces in memory.

Weight sync on CPU: vLLM's GPU-only transfer backends and sleep mode are out, and a direct
``model.load_weights`` fails (oneDNN packs the linear weights and empties the parameters). vLLM's worker
``reload_weights`` restores the parameter shapes, loads and repacks; it is reached through a worker
extension (:class:`WeightSwap`) with ``collective_rpc``, whose arguments are msgpack'd, so the learner writes
each policy version to one safetensors file (in /dev/shm) and the engines get its path.

Every completion carries the policy version that sampled it and, per token, the log-probability of the
sampled token under the distribution it was drawn from (vLLM's ``processed_logprobs``: logits / temperature,
then top-k / top-p), which the learner's truncated importance weights need.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.cpu_engine import cuda_available
from posttrain.errors import PosttrainError
from serving.tiers import (
    EngineConfig,
    base_engine_kwargs,
    engine_env,
    model_window,
)

log = logging.getLogger(__name__)


def _rollout_engine() -> EngineConfig:
    return EngineConfig(
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=64,
        tool_call_parser=None,
        intel_openmp=False,
        # Rollout engines share the cores with the learners: keep vLLM's own reservation of a core.
        cpu_reserved_cores=None,
        # On CPU the KV cache is host memory: size it, not a fraction of one NUMA node per engine.
        extra={"kv_cache_memory_bytes": 256 * 1024 * 1024},
    )


class RolloutEngineConfig(BaseModel):
    """One rollout engine: vLLM settings (as for a served tier) and the Ray resources of its actor."""

    model_config = ConfigDict(extra="forbid")

    engine: EngineConfig = Field(
        default_factory=_rollout_engine,
        description="vLLM settings. Rollout defaults: float32 (the learner's dtype, so behaviour log-probs "
        "match), 2048-token context, 64 sequences per step, a 256 MiB KV cache, no tool parser.",
    )
    num_cpus: float = Field(
        1.0, gt=0.0, description="Ray CPUs reserved per engine actor (fractional on small machines)."
    )
    num_gpus: float = Field(0.0, ge=0.0, description="Ray GPUs per engine actor (0 on CPU).")
    capacity: int = Field(
        8, ge=1, description="Rollout jobs (prompt groups) one engine runs at once; vLLM batches them."
    )
    start_timeout_s: float = Field(600.0, gt=0.0, description="Longest wait for an engine to start.")

    @field_validator("engine", mode="before")
    @classmethod
    def _over_rollout_defaults(cls, value: Any) -> Any:
        """Settings given in YAML override the rollout defaults one by one (``extra`` as a whole), instead of
        falling back to the served tiers' defaults for everything not given."""
        if isinstance(value, dict):
            return _rollout_engine().model_dump() | value
        return value


class WeightSwap:
    """vLLM worker extension (``worker_extension_cls``): reload the model's weights in place from one
    safetensors file, with vLLM's own ``reload_weights`` (shape restore, load, repack)."""

    def tandem_load_weights(self, path: str) -> int:
        from safetensors import safe_open

        names: list[str] = []

        def tensors() -> Any:
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():
                    names.append(name)
                    yield name, handle.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        _retie_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
        return len(names)


def _retie_lm_head(model: Any) -> None:
    """vLLM 0.32's layerwise reload (``model_loader/reload/layerwise.py``) counts a tied ``lm_head``, absent from
    the checkpoint, as not loaded and puts its old kernel tensors back: the head would keep the previous policy
    (measured: greedy tokens then differ from the pushed model's). Tie it to the new embeddings again and let
    its method prepare it anew (on CPU that rebuilds the oneDNN matmul handle)."""
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None:
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)


class RolloutEngine:
    """A vLLM ``AsyncLLM`` in an async Ray actor (:func:`start_engines` wraps it). Concurrent
    :meth:`generate` calls batch in the engine; :meth:`load_weights` waits for them to finish, swaps the
    weights, and holds new ones back meanwhile, so every completion comes from one policy version."""

    def __init__(self, model_dir: str, config: dict[str, Any], name: str) -> None:
        self.model_dir = model_dir
        self.config = RolloutEngineConfig.model_validate(config)
        self.name = name
        self.version = 0
        self.engine: Any = None
        self.in_flight = 0
        self.swapping = False
        self.changed: asyncio.Condition | None = None

    async def start(self) -> dict[str, Any]:
        """Build the engine (in the actor's event loop, where AsyncLLM must live); returns its settings."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = self.config.engine
        os.environ.update(engine.env)
        kwargs = base_engine_kwargs(engine)
        kwargs |= {
            # vLLM's Ray executor refuses the CPU platform, and this actor is already the unit Ray schedules.
            "distributed_executor_backend": "uni" if engine.tensor_parallel_size == 1 else "mp",
            "worker_extension_cls": f"{WeightSwap.__module__}.{WeightSwap.__qualname__}",
            "logprobs_mode": "processed_logprobs",
            "disable_log_stats": True,
        }
        if not cuda_available():
            # vLLM 0.32 on CPU kills the engine when a seeded request's prefill is chunked ("CPU Generator does
            # not use offset", gpu_model_runner._bookkeeping_sync), and every rollout is seeded: prefill whole.
            window = engine.max_model_len or model_window(self.model_dir)
            kwargs |= {"enable_chunked_prefill": False, "max_num_batched_tokens": window}
        kwargs.update(engine.extra)
        started = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model_dir, **kwargs))
        self.changed = asyncio.Condition()
        seconds = time.monotonic() - started
        log.info("event=engine_started name=%s seconds=%.1f", self.name, seconds)
        return {"name": self.name, "seconds": seconds, "pid": os.getpid()}

    async def generate(
        self, prompts: list[list[int]], sampling: dict[str, Any], seed: int | None = None
    ) -> list[list[dict[str, Any]]]:
        """``sampling["n"]`` completions per prompt (token ids): per completion its token ids, text, per-token
        behaviour log-probs, finish reason and the policy version that sampled it."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert self.engine is not None and self.changed is not None, "call start() first"
        params = SamplingParams(
            n=int(sampling.get("n", 1)),
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k") or 0),
            max_tokens=int(sampling["max_tokens"]),
            min_tokens=int(sampling.get("min_tokens", 0)),
            seed=seed,
            logprobs=0,  # the sampled token's own log-prob only
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        async with self.changed:
            await self.changed.wait_for(lambda: not self.swapping)
            self.in_flight += 1
            version = self.version
        try:
            outputs = await asyncio.gather(*(self._one(ids, params) for ids in prompts))
        finally:
            async with self.changed:
                self.in_flight -= 1
                self.changed.notify_all()
        return [
            [
                {
                    "token_ids": list(c.token_ids),
                    "text": c.text,
                    "logprobs": [
                        float(position[token].logprob)
                        for position, token in zip(c.logprobs or [], c.token_ids, strict=True)
                    ],
                    "finish_reason": c.finish_reason,
                    "policy_version": version,
                }
                for c in sorted(output.outputs, key=lambda c: c.index)
            ]
            for output in outputs
        ]

    async def _one(self, prompt_ids: list[int], params: Any) -> Any:
        final = None
        async for output in self.engine.generate(
            {"prompt_token_ids": prompt_ids}, params, request_id=uuid.uuid4().hex
        ):
            final = output
        assert final is not None
        return final

    async def load_weights(self, path: str, version: int) -> float:
        """Replace the weights with the safetensors file at ``path`` (policy ``version``); returns seconds."""
        assert self.engine is not None and self.changed is not None, "call start() first"
        if not Path(path).is_file():
            raise PosttrainError(f"engine {self.name}: no weights at {path}")
        started = time.monotonic()
        async with self.changed:
            self.swapping = True
            await self.changed.wait_for(lambda: self.in_flight == 0)
        try:
            counts = await self.engine.collective_rpc("tandem_load_weights", args=(path,))
            await self.engine.reset_prefix_cache()  # cached prefixes hold the old policy's keys and values
            self.version = version
        finally:
            async with self.changed:
                self.swapping = False
                self.changed.notify_all()
        seconds = time.monotonic() - started
        log.info(
            "event=weights_loaded name=%s version=%d tensors=%s seconds=%.2f",
            self.name,
            version,
            counts,
            seconds,
        )
        return seconds

    async def policy_version(self) -> int:
        return self.version

    async def ping(self) -> str:
        if self.engine is not None:
            await self.engine.check_health()
        return self.name

    async def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def start_engines(
    model_dir: Path | str, config: RolloutEngineConfig, count: int, prefix: str = "rollout"
) -> dict[str, Any]:
    """Start ``count`` engine actors on ``model_dir`` and wait until every one is ready: {name: handle}."""
    import ray

    env = engine_env(config.engine) if config.num_gpus == 0 else dict(config.engine.env)
    actor: Any = ray.remote(RolloutEngine).options(  # type: ignore[attr-defined]
        num_cpus=config.num_cpus,
        num_gpus=config.num_gpus,
        max_concurrency=max(16, 2 * config.capacity),
        runtime_env={"env_vars": env} if env else None,
    )
    handles: dict[str, Any] = {
        f"{prefix}-{index}": actor.remote(str(model_dir), config.model_dump(mode="json"), f"{prefix}-{index}")
        for index in range(count)
    }
    try:
        ready = ray.get([h.start.remote() for h in handles.values()], timeout=config.start_timeout_s)
    except Exception as error:
        for handle in handles.values():
            ray.kill(handle)
        raise PosttrainError(f"rollout engines did not start: {type(error).__name__}: {error}") from error
    for info in ready:
        log.info("event=engine_ready name=%s seconds=%.1f pid=%s", info["name"], info["seconds"], info["pid"])
    return handles


def save_weights_for_engines(model: Any, path: Path) -> Path:
    """Write ``model``'s weights where the engines can load them: one safetensors file with the checkpoint's
    (Hugging Face) tensor names, a tied ``lm_head`` left out (vLLM ties it to the embeddings), written to a
    temporary name and renamed, so an engine never reads half a file."""
    from safetensors.torch import save_file

    module = getattr(model, "module", model)
    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in module.state_dict().items()}
    if getattr(module.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    save_file(state, str(partial), metadata={"format": "pt"})
    os.replace(partial, path)
    return path
