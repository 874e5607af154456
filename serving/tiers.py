"""Tier configuration: a pydantic ``TierConfig`` per tier, resolved against the registry into a Ray Serve
LLM ``LLMConfig``.

The standard tier serves the release's weights; the fast tier serves the *same* weights with vLLM's
speculative decoding. Spec decoding is engine-wide in vLLM, so each tier is its own deployment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.bundled import BUNDLED_REF
from infra.cpu_engine import cpu_engine_env, cuda_available
from infra.errors import ConfigError
from infra.manifest import ArtifactManifest
from infra.registry import Registry, registry_step

# standard: the model as trained; fast: the same weights with speculative decoding; long: the same weights
# with RoPE scaling past their trained window (asked for by model id only, never chosen by `auto`).
TierName = Literal["standard", "fast", "long"]


class EngineConfig(BaseModel):
    """vLLM engine settings shared by a tier's replicas. Defaults suit the CPU build on a small machine."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "float32",
        description="Compute dtype. float32 by default: vLLM CPU 0.32 in bfloat16 answers the bundled model's "
        "prompts wrongly where transformers' bfloat16 does not (measured), and float32 keeps the fast tier "
        "token-identical to the standard tier. Use bfloat16 on GPUs.",
    )
    max_model_len: int | None = Field(
        None,
        ge=128,
        description="Longest prompt + completion, in tokens; None: the model's own window (its config's "
        "max_position_embeddings, 8,192 for the bundled model). `/v1/models` and the 400 for a longer prompt "
        "come from the engine, so this is the only place the limit is set.",
    )
    gpu_memory_utilization: float = Field(
        0.12,
        gt=0.0,
        le=0.98,
        description="On CUDA the GPU memory fraction; on vLLM CPU the fraction of host memory for KV cache.",
    )
    enforce_eager: bool = Field(True, description="Skip graph capture: ~4x faster engine start on CPU.")
    max_num_seqs: int = Field(32, ge=1, description="Most sequences batched together per engine step.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per replica (CUDA only).")
    seed: int = Field(0, description="Engine seed; per-request `seed` still wins.")
    chunked_prefill: bool | None = Field(
        None,
        description="Split long prefills into max_num_batched_tokens chunks (vLLM's enable_chunked_prefill). "
        "None: vLLM's default on CUDA; off on CPU, where vLLM 0.32 kills the engine when a request with a "
        "`seed` has its prefill chunked ('CPU Generator does not use offset'). The price, measured by "
        "`tandem bench context`: while an 8k-token prompt prefills, other streams stall for its whole prefill "
        "(43 s here) instead of up to one chunk's (14 s at 2,048, 0.6 s at 64). True on CPU is refused.",
    )
    tool_call_parser: str | None = Field(
        "hermes",
        description="vLLM tool-call parser for `tool_choice: auto` requests (None disables tool calling); "
        "'hermes' reads the <tool_call>{json}</tool_call> format.",
    )
    tool_strict_level: Literal["auto", "function", "parameter"] = Field(
        "parameter",
        description="vLLM's --tool-strict-level: how far decoding is constrained when a request has tools. "
        "'parameter' (default) constrains every call's arguments to its tool's JSON schema, as if each tool "
        "said `strict: true`, so a named or `required` tool_choice always yields a parseable call; 'auto' "
        "leaves arguments free unless the client sets `strict` (the bundled model then often writes "
        "arguments that are not JSON).",
    )
    intel_openmp: bool = Field(
        True,
        description="On CPU, preload Intel OpenMP (libiomp5.so, shipped in the environment by pip's "
        "intel-openmp) into the engine processes, as vLLM's CPU backend advises for speculative decoding "
        "(`tandem bench fast` measures both ways). Ignored on CUDA or when the library is absent.",
    )
    cpu_reserved_cores: int | None = Field(
        0,
        ge=0,
        description="On CPU, cores vLLM binds no model thread to, left to its scheduler process "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU). None keeps vLLM's default of one, which halves the model's threads on "
        "a 2-core host: `tandem bench fast` measured the standard tier at 47.0 ms per token with it and 32.9 ms "
        "with 0 (two engines decoding at once: 17.0 vs 21.8 tok/s together). Reserve one on hosts with many "
        "cores, where a core less costs little. Ignored on CUDA.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of the engine processes (wins over the above)."
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="Passed verbatim to vLLM's engine args.")


SpeculativeMethod = Literal["auto", "eagle3", "draft_model", "ngram"]


class SpeculativeConfig(BaseModel):
    """How the fast tier speculates. ``auto`` uses the tier model's draft with the best expected speedup
    (an EAGLE-3 head or a layer-subset draft, each measured when it was trained) when one is expected to
    pay, else vLLM's n-gram prompt lookup (needs no draft weights)."""

    model_config = ConfigDict(extra="forbid")

    method: SpeculativeMethod = Field(
        "auto",
        description="eagle3: an EAGLE-3 head (`tandem distill --method eagle3`); draft_model: a small draft "
        "LM (`--method layer-subset`); ngram: prompt lookup; auto: the best measured draft, else ngram.",
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=16, description="Draft tokens per step; default: the draft's recorded choice, else 3."
    )
    draft: str | None = Field(None, description="Registry ref or local directory of the draft (draft_model).")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest n-gram matched in the prompt.")
    prompt_lookup_min: int = Field(2, ge=1, description="ngram: shortest n-gram matched in the prompt.")

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.draft:
            raise ValueError("method 'draft_model' needs `draft` (a registry ref or a local directory)")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        return self


class ContextExtension(BaseModel):
    """Serve the weights past their trained window by RoPE scaling (vLLM ``hf_overrides``): ``factor`` times
    the model's ``max_position_embeddings``. YaRN keeps short-range positions nearly as trained."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["yarn", "linear", "dynamic"] = Field(
        "yarn", description="RoPE scaling: yarn (default), linear position interpolation, or dynamic NTK."
    )
    factor: float = Field(2.0, gt=1.0, le=16.0, description="Window multiple, e.g. 2 or 4.")


class TierConfig(BaseModel):
    """One served tier: public id, aliases, weights, engine settings and (fast tier) speculation."""

    model_config = ConfigDict(extra="forbid")

    name: TierName
    model_id: str = Field(description="Public model id clients send, e.g. 'tandem-standard'.")
    aliases: list[str] = Field(default_factory=list, description="Other ids that route to this tier.")
    model: str = Field(BUNDLED_REF, description="Registry ref ('name@version') or a local model directory.")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    speculative: SpeculativeConfig | None = Field(None, description="Set for the fast tier only.")
    context_extension: ContextExtension | None = Field(
        None,
        description="RoPE-scaled window (the `long` tier): the engine serves factor x the model's window; "
        "check recall with the long_context eval family before trusting it.",
    )
    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(
        1.0,
        gt=0,
        description="CPUs for the engine in its placement-group bundle; Serve LLM adds the replica actor's 1 "
        "CPU, so a replica reserves num_cpus + 1 on one node.",
    )
    graceful_shutdown_timeout_s: float = Field(
        5.0,
        ge=0,
        description="On shutdown, how long an engine replica lets its in-flight requests finish before they "
        "are ended (keeps SIGTERM to `tandem serve` under 15 s).",
    )
    health_check_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds Serve waits for a replica's health check before replacing the replica (Serve's "
        "default is 10). A CPU engine on a saturated node can answer late, and a missed check restarts the "
        "engine with its requests in flight.",
    )

    @model_validator(mode="after")
    def _check(self) -> TierConfig:
        if self.name == "fast" and self.speculative is None:
            self.speculative = SpeculativeConfig()
        if self.name == "standard" and self.speculative is not None:
            raise ValueError("the standard tier does not speculate; remove `speculative`")
        return self


def default_tiers() -> list[TierConfig]:
    return [
        TierConfig(name="standard", model_id="tandem-standard", aliases=["standard"]),
        TierConfig(name="fast", model_id="tandem-fast", aliases=["fast"]),
    ]


@dataclass(frozen=True)
class ResolvedTier:
    """A tier with every registry ref turned into a verified local directory."""

    config: TierConfig
    model_path: Path
    model_version: str
    draft_path: Path | None = None
    draft_version: str | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None

    @property
    def version(self) -> str:
        """What the ``x-tandem-version`` header reports: weights, plus the draft for the fast tier."""
        return self.model_version if not self.draft_version else f"{self.model_version}+{self.draft_version}"


def _local_or_registry(ref: str, registry: Registry) -> tuple[Path, str, ArtifactManifest | None]:
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve(), path.name, None
    manifest = registry.manifest(ref)
    return registry.fetch(manifest.ref), manifest.ref, manifest


def draft_method(manifest: ArtifactManifest) -> str:
    """The vLLM speculative method a draft artifact serves with (layer-subset drafts predate the field)."""
    return str(
        manifest.metadata.get("method")
        or manifest.metadata.get("speculative_config", {}).get("method")
        or "draft_model"
    )


def newest_draft_for(
    registry: Registry, model_ref: str, *, method: str | None = None
) -> ArtifactManifest | None:
    """The draft of ``model_ref`` expected to be fastest, newest first among equals; None if none pays.

    Each draft records ``expected_speedup`` from its held-out acceptance and measured cost ratio; drafts
    expected to be slower than no speculation are skipped, so ``auto`` falls back to n-gram lookup rather
    than serving a fast tier slower than the standard one. ``method`` keeps only drafts of that method.
    """
    drafts = [
        m
        for m in registry.list(kind="draft")
        if model_ref in m.lineage.parents
        and float(m.metadata.get("expected_speedup", 2.0)) > 1.0
        and (method is None or draft_method(m) == method)
    ]
    return (
        max(drafts, key=lambda m: (float(m.metadata.get("expected_speedup", 0.0)), m.created_at))
        if drafts
        else None
    )


def resolve_tier(tier: TierConfig, registry: Registry) -> ResolvedTier:
    """Fetch (and verify) the tier's weights and, for the fast tier, choose and fetch its draft; a registry
    outage is raised naming the tier and the artifact it was fetching."""
    with registry_step(f"fetching the {tier.name} tier's model {tier.model}"):
        model_path, model_version, _ = _local_or_registry(tier.model, registry)
    spec = tier.speculative
    if spec is None:
        return ResolvedTier(tier, model_path, model_version)
    draft = spec.draft or "(chosen from the registry)"
    with registry_step(f"fetching the {tier.name} tier's draft {draft} for {model_version}"):
        return _resolve_speculative(tier, spec, registry, model_path, model_version)


def _resolve_speculative(
    tier: TierConfig, spec: SpeculativeConfig, registry: Registry, model_path: Path, model_version: str
) -> ResolvedTier:
    draft_ref = spec.draft
    if spec.method == "auto" and draft_ref is None:
        found = newest_draft_for(registry, model_version)
        draft_ref = found.ref if found else None
    elif spec.method == "eagle3" and draft_ref is None:
        found = newest_draft_for(registry, model_version, method="eagle3")
        if found is None:
            raise ConfigError(
                f"tier {tier.name!r}: speculative.method eagle3 but {model_version} has no EAGLE-3 head expected "
                "to pay in the registry; run `tandem distill --method eagle3` or set speculative.draft"
            )
        draft_ref = found.ref
    if spec.method == "ngram" or draft_ref is None:
        k = spec.num_speculative_tokens or 3
        return ResolvedTier(
            tier, model_path, model_version, speculative_method="ngram", num_speculative_tokens=k
        )
    draft_path, draft_version, draft_manifest = _local_or_registry(draft_ref, registry)
    recorded = (draft_manifest.metadata.get("num_speculative_tokens") if draft_manifest else None) or 3
    k = spec.num_speculative_tokens or int(recorded)
    method: str
    if spec.method in ("eagle3", "draft_model"):
        method = spec.method
    elif draft_manifest is not None:
        method = draft_method(draft_manifest)
    else:
        method = "eagle3" if _is_eagle3_dir(draft_path) else "draft_model"
    return ResolvedTier(
        tier,
        model_path,
        model_version,
        draft_path=draft_path,
        draft_version=draft_version,
        speculative_method=method,
        num_speculative_tokens=k,
    )


def _is_eagle3_dir(directory: Path) -> bool:
    """An EAGLE-3 head's config names an Eagle3 architecture (read without importing torch)."""
    import json

    config = directory / "config.json"
    architectures = json.loads(config.read_text()).get("architectures", []) if config.is_file() else []
    return any("Eagle3" in name for name in architectures)


def base_engine_kwargs(engine: EngineConfig) -> dict[str, Any]:
    """vLLM engine arguments of an :class:`EngineConfig` alone, without ``extra`` (the caller applies it last):
    shared by the served tiers and post-training's rollout engines. The OpenAI layer's arguments are
    :func:`frontend_kwargs`."""
    kwargs: dict[str, Any] = {
        "dtype": engine.dtype,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "enforce_eager": engine.enforce_eager,
        "max_num_seqs": engine.max_num_seqs,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": engine.seed,
    }
    if engine.max_model_len is not None:
        kwargs["max_model_len"] = engine.max_model_len
    return kwargs


def prefill_kwargs(engine: EngineConfig, window: int) -> dict[str, Any]:
    """Chunked prefill per :attr:`EngineConfig.chunked_prefill`: on CPU whole prefills (a batch holds one
    full-window prompt), since a chunked seeded prefill kills vLLM 0.32's CPU engine."""
    if cuda_available():
        return {} if engine.chunked_prefill is None else {"enable_chunked_prefill": engine.chunked_prefill}
    if engine.chunked_prefill:
        raise ConfigError(
            "engine.chunked_prefill: true is refused on CPU: vLLM 0.32 CPU kills the engine when a seeded "
            "request's prefill is chunked"
        )
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": window}


def model_window(model_dir: str | Path) -> int:
    """The context window a model was trained for: its config's ``max_position_embeddings``."""
    return int(_model_config(model_dir)["max_position_embeddings"])


def _model_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the model's config: {exc}") from exc
    if "max_position_embeddings" not in config:
        raise ConfigError(
            f"{path}: no max_position_embeddings (the trained window); set engine.max_model_len for this model"
        )
    return dict(config)


def extension_kwargs(
    extension: ContextExtension, model_dir: str | Path, max_model_len: int | None
) -> dict[str, Any]:
    """vLLM arguments that serve ``model_dir`` at ``extension.factor`` x its window: RoPE parameters through
    ``hf_overrides`` (Transformers 5's ``rope_parameters``) and the longer ``max_model_len``."""
    config = _model_config(model_dir)
    window = int(config["max_position_embeddings"])
    original = config.get("rope_parameters") or {}
    theta = original.get("rope_theta", config.get("rope_theta", 10000.0))
    extended = int(window * extension.factor)
    rope = {
        "rope_type": extension.method,
        "factor": extension.factor,
        "rope_theta": theta,
        "original_max_position_embeddings": window,
    }
    overrides: dict[str, Any] = {"rope_parameters": rope}
    if extension.method == "yarn":
        # vLLM takes a YaRN config's max_position_embeddings as already scaled (Transformers' convention).
        overrides["max_position_embeddings"] = extended
    return {"hf_overrides": overrides, "max_model_len": max_model_len or extended}


def frontend_kwargs(engine: EngineConfig) -> dict[str, Any]:
    """Arguments of vLLM's OpenAI layer (Ray Serve LLM routes them there, not to the engine): tool calling."""
    if not engine.tool_call_parser:
        return {}
    return {
        "enable_auto_tool_choice": True,
        "tool_call_parser": engine.tool_call_parser,
        "tool_strict_level": engine.tool_strict_level,
    }


def engine_kwargs(resolved: ResolvedTier) -> dict[str, Any]:
    """vLLM engine arguments for a resolved tier."""
    engine = resolved.config.engine
    kwargs = base_engine_kwargs(engine) | frontend_kwargs(engine)
    if resolved.config.context_extension is not None:
        kwargs |= extension_kwargs(
            resolved.config.context_extension, resolved.model_path, engine.max_model_len
        )
    # Spelled out (the model's own window unless configured) so Serve's /v1/models card reports it too.
    kwargs.setdefault("max_model_len", model_window(resolved.model_path))
    kwargs |= prefill_kwargs(engine, kwargs["max_model_len"])
    if resolved.speculative_method == "ngram":
        spec = resolved.config.speculative
        assert spec is not None
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": resolved.num_speculative_tokens,
            "prompt_lookup_max": spec.prompt_lookup_max,
            "prompt_lookup_min": spec.prompt_lookup_min,
        }
    elif resolved.speculative_method in ("draft_model", "eagle3"):
        kwargs["speculative_config"] = {
            "method": resolved.speculative_method,
            "model": str(resolved.draft_path),
            "num_speculative_tokens": resolved.num_speculative_tokens,
        }
    kwargs.update(engine.extra)
    return kwargs


def engine_env(engine: EngineConfig) -> dict[str, str]:
    """Environment variables of a tier's engine processes (set through the replica's Ray runtime_env)."""
    return cpu_engine_env(
        intel_openmp=engine.intel_openmp, reserved_cores=engine.cpu_reserved_cores, env=engine.env
    )


def to_llm_config(resolved: ResolvedTier) -> Any:
    """The Ray Serve LLM ``LLMConfig`` for one resolved tier."""
    from ray.serve.llm import LLMConfig

    tier = resolved.config
    bundle: dict[str, float] = {"CPU": tier.num_cpus}
    if cuda_available():
        bundle["GPU"] = 1
    try:
        return LLMConfig(
            model_loading_config={"model_id": tier.model_id, "model_source": str(resolved.model_path)},
            engine_kwargs=engine_kwargs(resolved),
            deployment_config={
                "num_replicas": tier.replicas,
                "health_check_timeout_s": tier.health_check_timeout_s,
                "graceful_shutdown_timeout_s": tier.graceful_shutdown_timeout_s,
            },
            placement_group_config={"bundles": [bundle] * tier.engine.tensor_parallel_size},
            log_engine_metrics=True,
            runtime_env={"env_vars": engine_env(tier.engine)},
        )
    except ValueError as exc:
        raise ConfigError(f"tier {tier.name!r}: invalid engine configuration: {exc}") from exc
