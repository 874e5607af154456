"""One vLLM engine measurement, run in its own process by :mod:`distill.bench` (engines never overlap).

Usage: ``python -m distill.bench_engine <spec.json> <result.json>``. The spec names the model, dtype,
optional speculative config, prompts (token ids) and what to measure; the result holds timings, token
ids and the engine's spec-decode counters.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _spec_counters(llm: Any) -> dict[str, Any]:
    found: dict[str, Any] = {name.split(":")[-1]: 0 for name in SPEC_COUNTERS}
    found["num_accepted_tokens_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            found[metric.name.split(":")[-1]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            previous = found["num_accepted_tokens_per_pos"] or [0] * len(values)
            found["num_accepted_tokens_per_pos"] = [a + b for a, b in zip(previous, values, strict=True)]
    return found


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    delta = {k: after[k] - before[k] for k in after if k != "num_accepted_tokens_per_pos"}
    per_pos_before = before["num_accepted_tokens_per_pos"] or [0] * len(after["num_accepted_tokens_per_pos"])
    delta["num_accepted_tokens_per_pos"] = [
        a - b for a, b in zip(after["num_accepted_tokens_per_pos"], per_pos_before, strict=True)
    ]
    drafts, draft_tokens = delta["spec_decode_num_drafts"], delta["spec_decode_num_draft_tokens"]
    accepted = delta["spec_decode_num_accepted_tokens"]
    delta["acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
    delta["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    return delta


def measure_engine(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine_kwargs: dict[str, Any] = {
        "model": spec["model"],
        "dtype": spec["dtype"],
        "enforce_eager": True,
        "gpu_memory_utilization": spec.get("gpu_memory_utilization", 0.2),
        "max_model_len": spec.get("max_model_len", 1024),
        "seed": 0,
        "disable_log_stats": False,
    }
    if spec.get("speculative_config"):
        engine_kwargs["speculative_config"] = spec["speculative_config"]
    started = time.perf_counter()
    llm = LLM(**engine_kwargs)
    result: dict[str, Any] = {"engine_start_s": time.perf_counter() - started, "phases": {}}
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up

    for phase in spec["phases"]:
        counters_before = _spec_counters(llm)
        subset = prompts[: phase["prompts"]]
        params = SamplingParams(temperature=0.0, max_tokens=phase.get("max_tokens", spec["max_tokens"]))
        started = time.perf_counter()
        if phase["streams"] == 1:
            outputs = [llm.generate([p], params, use_tqdm=False)[0] for p in subset]
        else:
            outputs = []
            for start in range(0, len(subset), phase["streams"]):
                outputs += llm.generate(subset[start : start + phase["streams"]], params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        generated = sum(len(t) for t in tokens)
        result["phases"][phase["name"]] = {
            "streams": phase["streams"],
            "requests": len(subset),
            "generated_tokens": generated,
            "seconds": elapsed,
            "tokens_per_s": generated / elapsed,
            "token_ids": tokens,
            "spec_decode": _delta(_spec_counters(llm), counters_before)
            if spec.get("speculative_config")
            else None,
        }
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = measure_engine(spec)
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
