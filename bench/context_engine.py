"""One chunked-prefill variant measured in its own vLLM engine process, run by :mod:`bench.context`.

Usage: ``python -m bench.context_engine <spec.json> <result.json>``. The spec holds the engine arguments,
the short prompts and the long prompt (token ids); the result holds, per phase, every short stream's
output-token arrival times (seconds since the phase started) and, for the loaded phase, when the long
prompt was submitted, produced its first token and ended. Statistics are computed by the orchestrator.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any


async def _stream(
    engine: Any,
    ids: list[int],
    params: Any,
    origin: float,
    arrivals: list[float],
    produced: asyncio.Event | None = None,
    produce_at: int = 0,
) -> None:
    """Generate ``ids``; append each output token's arrival time (since ``origin``) to ``arrivals``.

    Tokens that reach the client together (the consumer lagged a step) share the arrival time; the
    orchestrator spreads that gap over them. ``produced`` is set once ``produce_at`` tokens arrived.
    """
    from vllm.inputs import TokensPrompt

    seen = 0
    async for output in engine.generate(TokensPrompt(prompt_token_ids=ids), params, str(uuid.uuid4())):
        count = len(output.outputs[0].token_ids)
        now = time.perf_counter() - origin
        arrivals.extend([now] * (count - seen))
        seen = count
        if produced is not None and seen >= produce_at:
            produced.set()
    if produced is not None:
        produced.set()


async def _unloaded(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams

    # No `seed`: vLLM 0.32 CPU kills the engine when a seeded request's prefill is chunked.
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    origin = time.perf_counter()
    arrivals: list[list[float]] = [[] for _ in prompts]
    await asyncio.gather(
        *(_stream(engine, ids, params, origin, a) for ids, a in zip(prompts, arrivals, strict=True))
    )
    return {"seconds": time.perf_counter() - origin, "arrivals": arrivals}


async def _loaded(
    engine: Any,
    prompts: list[list[int]],
    long_prompt: list[int],
    max_tokens: int,
    long_max_tokens: int,
    tokens_before_long: int,
) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    long_params = SamplingParams(temperature=0.0, max_tokens=long_max_tokens, ignore_eos=True)
    origin = time.perf_counter()
    arrivals: list[list[float]] = [[] for _ in prompts]
    started = [asyncio.Event() for _ in prompts]
    shorts = [
        asyncio.ensure_future(_stream(engine, ids, params, origin, a, event, tokens_before_long))
        for ids, a, event in zip(prompts, arrivals, started, strict=True)
    ]
    # The long prompt arrives once every short stream is decoding, as a new user would mid-conversation.
    await asyncio.gather(*(event.wait() for event in started))
    long_arrivals: list[float] = []
    submitted = time.perf_counter() - origin
    await _stream(engine, long_prompt, long_params, origin, long_arrivals)
    await asyncio.gather(*shorts)
    return {
        "seconds": time.perf_counter() - origin,
        "arrivals": arrivals,
        "long_submitted_s": submitted,
        "long_first_token_s": long_arrivals[0] if long_arrivals else None,
        "long_done_s": long_arrivals[-1] if long_arrivals else None,
        "long_tokens": len(long_arrivals),
    }


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec["engine"]))
    scheduler = engine.vllm_config.scheduler_config
    result: dict[str, Any] = {
        "engine_start_s": time.perf_counter() - started,
        # What vLLM resolved, so a variant that sets nothing records the defaults it got.
        "enable_chunked_prefill": bool(scheduler.enable_chunked_prefill),
        "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
    }
    prompts: list[list[int]] = spec["prompts"]
    try:
        warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        from vllm.inputs import TokensPrompt

        # Warm-up with a different long-ish prompt: the measured long prompt must not hit the prefix cache.
        warm_prompts = [*prompts, spec["warmup_prompt"]]
        await asyncio.gather(
            *(
                _drain(engine.generate(TokensPrompt(prompt_token_ids=ids), warm, str(uuid.uuid4())))
                for ids in warm_prompts
            )
        )
        result["unloaded"] = [
            await _unloaded(engine, prompts, spec["max_tokens"]) for _ in range(spec["repeats"])
        ]
        result["loaded"] = [
            await _loaded(
                engine,
                prompts,
                long_prompt,
                spec["loaded_max_tokens"],
                spec["long_max_tokens"],
                spec["tokens_before_long"],
            )
            for long_prompt in spec["long_prompts"]
        ]
    finally:
        engine.shutdown()
    return result


async def _drain(outputs: Any) -> None:
    async for _ in outputs:
        pass


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(measure(spec))
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
