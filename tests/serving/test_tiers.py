"""TierConfig -> resolved tier -> Ray Serve LLM LLMConfig, and draft selection from the registry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.errors import ArtifactNotFound
from infra.manifest import Lineage
from infra.registry import FileRegistry
from serving.tiers import SpeculativeConfig, TierConfig, engine_kwargs, resolve_tier, to_llm_config


def _model_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text('{"max_position_embeddings": 2048}')
    return path


@pytest.fixture
def registry(tmp_path: Path) -> FileRegistry:
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(_model_dir(tmp_path, "m"), "toy", "v1", kind="model")
    return registry


def test_standard_tier_has_no_speculation(registry: FileRegistry) -> None:
    resolved = resolve_tier(TierConfig(name="standard", model_id="tandem-standard", model="toy@v1"), registry)
    kwargs = engine_kwargs(resolved)
    assert "speculative_config" not in kwargs
    assert kwargs["dtype"] == "float32" and kwargs["enforce_eager"] is True
    assert resolved.version == "toy@v1"
    config = to_llm_config(resolved)
    assert config.model_id == "tandem-standard"
    assert config.model_loading_config.model_source == str(registry.fetch("toy@v1"))


def test_fast_tier_falls_back_to_ngram_without_a_draft(registry: FileRegistry) -> None:
    resolved = resolve_tier(TierConfig(name="fast", model_id="tandem-fast", model="toy@v1"), registry)
    spec = engine_kwargs(resolved)["speculative_config"]
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }


def test_fast_tier_picks_newest_draft_of_its_model(registry: FileRegistry, tmp_path: Path) -> None:
    lineage = Lineage(parents=["toy@v1"])
    registry.publish(_model_dir(tmp_path, "d1"), "toy-draft", "v1", kind="draft", lineage=lineage)
    time.sleep(0.01)
    registry.publish(
        _model_dir(tmp_path, "d2"),
        "toy-draft",
        "v2",
        kind="draft",
        lineage=lineage,
        metadata={"num_speculative_tokens": 5},
    )
    registry.publish(
        _model_dir(tmp_path, "other"), "other-draft", "v1", kind="draft", lineage=Lineage(parents=["x@v1"])
    )
    resolved = resolve_tier(TierConfig(name="fast", model_id="tandem-fast", model="toy@v1"), registry)
    assert resolved.speculative_method == "draft_model"
    assert resolved.draft_version == "toy-draft@v2"
    assert resolved.version == "toy@v1+toy-draft@v2"
    spec = engine_kwargs(resolved)["speculative_config"]
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 5
    assert spec["model"] == str(registry.fetch("toy-draft@v2"))


def test_explicit_ngram_ignores_drafts(registry: FileRegistry, tmp_path: Path) -> None:
    registry.publish(
        _model_dir(tmp_path, "d"), "toy-draft", "v1", kind="draft", lineage=Lineage(parents=["toy@v1"])
    )
    tier = TierConfig(
        name="fast", model_id="f", model="toy@v1", speculative=SpeculativeConfig(method="ngram")
    )
    assert resolve_tier(tier, registry).speculative_method == "ngram"


def test_local_draft_directory(registry: FileRegistry, tmp_path: Path) -> None:
    draft = _model_dir(tmp_path, "local-draft")
    tier = TierConfig(
        name="fast",
        model_id="f",
        model="toy@v1",
        speculative=SpeculativeConfig(method="draft_model", draft=str(draft), num_speculative_tokens=2),
    )
    kwargs = engine_kwargs(resolve_tier(tier, registry))
    assert kwargs["speculative_config"] == {
        "method": "draft_model",
        "model": str(draft),
        "num_speculative_tokens": 2,
    }


def test_invalid_tier_configs() -> None:
    with pytest.raises(ValidationError, match="needs `draft`"):
        SpeculativeConfig(method="draft_model")
    with pytest.raises(ValidationError, match="does not speculate"):
        TierConfig(name="standard", model_id="s", speculative=SpeculativeConfig())
    with pytest.raises(ValidationError):
        TierConfig.model_validate({"name": "turbo", "model_id": "x"})


def test_unknown_model_ref(registry: FileRegistry) -> None:
    with pytest.raises(ArtifactNotFound):
        resolve_tier(TierConfig(name="standard", model_id="s", model="nope@v1"), registry)


def test_auto_skips_a_draft_expected_to_be_slower(registry: FileRegistry, tmp_path: Path) -> None:
    registry.publish(
        _model_dir(tmp_path, "slow"),
        "toy-draft",
        "slow",
        kind="draft",
        lineage=Lineage(parents=["toy@v1"]),
        metadata={"expected_speedup": 0.8, "num_speculative_tokens": 1},
    )
    resolved = resolve_tier(TierConfig(name="fast", model_id="tandem-fast", model="toy@v1"), registry)
    assert resolved.speculative_method == "ngram"


def _eagle3_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLMEagle3"], "max_position_embeddings": 2048}'
    )
    return path


def test_auto_picks_the_draft_with_the_best_measured_speedup(registry: FileRegistry, tmp_path: Path) -> None:
    lineage = Lineage(parents=["toy@v1"])
    registry.publish(
        _eagle3_dir(tmp_path, "head"),
        "toy-eagle3",
        "v1",
        kind="draft",
        lineage=lineage,
        metadata={"method": "eagle3", "expected_speedup": 1.6, "num_speculative_tokens": 4},
    )
    time.sleep(0.01)
    registry.publish(  # newer, but slower: auto must not prefer it
        _model_dir(tmp_path, "subset"),
        "toy-draft",
        "v1",
        kind="draft",
        lineage=lineage,
        metadata={"expected_speedup": 1.1},
    )
    resolved = resolve_tier(TierConfig(name="fast", model_id="tandem-fast", model="toy@v1"), registry)
    assert resolved.speculative_method == "eagle3" and resolved.draft_version == "toy-eagle3@v1"
    spec = engine_kwargs(resolved)["speculative_config"]
    assert spec == {
        "method": "eagle3",
        "model": str(registry.fetch("toy-eagle3@v1")),
        "num_speculative_tokens": 4,
    }


def test_eagle3_method_without_a_head_is_a_config_error(registry: FileRegistry) -> None:
    from infra.errors import ConfigError

    tier = TierConfig(
        name="fast", model_id="tandem-fast", model="toy@v1", speculative=SpeculativeConfig(method="eagle3")
    )
    with pytest.raises(ConfigError, match="no EAGLE-3 head"):
        resolve_tier(tier, registry)


def test_local_eagle3_directory_is_served_as_eagle3(registry: FileRegistry, tmp_path: Path) -> None:
    head = _eagle3_dir(tmp_path, "local-head")
    tier = TierConfig(
        name="fast", model_id="tandem-fast", model="toy@v1", speculative=SpeculativeConfig(draft=str(head))
    )
    resolved = resolve_tier(tier, registry)
    assert engine_kwargs(resolved)["speculative_config"]["method"] == "eagle3"


def test_intel_openmp_is_preloaded_into_cpu_engines_only_when_asked(registry: FileRegistry) -> None:
    from infra.cpu_engine import intel_openmp_library
    from serving.tiers import EngineConfig, engine_env

    if intel_openmp_library() is None:
        pytest.skip("no libiomp5.so in this environment")
    assert engine_env(EngineConfig())["LD_PRELOAD"].endswith("libiomp5.so")
    assert "LD_PRELOAD" not in engine_env(EngineConfig(intel_openmp=False))
    assert engine_env(EngineConfig(intel_openmp=False, cpu_reserved_cores=None, env={"A": "1"})) == {"A": "1"}
    resolved = resolve_tier(TierConfig(name="standard", model_id="tandem-standard", model="toy@v1"), registry)
    assert to_llm_config(resolved).runtime_env["env_vars"]["LD_PRELOAD"].endswith("libiomp5.so")


def test_cpu_engines_bind_model_threads_to_every_core_unless_told(registry: FileRegistry) -> None:
    from serving.tiers import EngineConfig, engine_env

    assert engine_env(EngineConfig())["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert engine_env(EngineConfig(cpu_reserved_cores=2))["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in engine_env(EngineConfig(cpu_reserved_cores=None))
    told = EngineConfig(env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})
    assert engine_env(told)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    resolved = resolve_tier(TierConfig(name="standard", model_id="tandem-standard", model="toy@v1"), registry)
    assert to_llm_config(resolved).runtime_env["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_cpu_engines_prefill_whole_prompts(registry: FileRegistry) -> None:
    """vLLM 0.32 CPU kills the engine when a seeded request's prefill is chunked: CPU tiers never chunk."""
    from infra.errors import ConfigError
    from serving.tiers import EngineConfig

    resolved = resolve_tier(TierConfig(name="standard", model_id="s", model="toy@v1"), registry)
    kwargs = engine_kwargs(resolved)
    assert kwargs["enable_chunked_prefill"] is False and kwargs["max_num_batched_tokens"] == 2048
    assert kwargs["max_model_len"] == 2048  # the model's own window, spelled out for /v1/models
    sized = TierConfig(name="standard", model_id="s", model="toy@v1", engine=EngineConfig(max_model_len=512))
    assert engine_kwargs(resolve_tier(sized, registry))["max_num_batched_tokens"] == 512
    chunked = TierConfig(
        name="standard", model_id="s", model="toy@v1", engine=EngineConfig(chunked_prefill=True)
    )
    with pytest.raises(ConfigError, match="seeded"):
        engine_kwargs(resolve_tier(chunked, registry))
