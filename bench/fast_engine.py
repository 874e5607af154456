"""One vLLM engine measurement, run in its own process by :mod:`bench.fast`.

Usage: ``python -m bench.fast_engine <spec.json> <result.json>``. The spec holds the engine arguments,
prompts (token ids) and the phases to time; the result holds per-phase timings, per-request TTFT and time
per output token, the token ids produced and the engine's spec-decode counters.

Engines that run at once coordinate through files: ``start_barrier`` makes them start timing together,
``turns`` makes them take turns request by request (one engine decodes while the others are stopped), so
each engine is timed over the same stretch of a drifting host.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _spec_counters(metrics: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {name.split(":")[-1]: 0 for name in SPEC_COUNTERS}
    found["per_position"] = []
    for metric in metrics:
        if metric.name in SPEC_COUNTERS:
            found[metric.name.split(":")[-1]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            previous = found["per_position"] or [0] * len(values)
            found["per_position"] = [a + b for a, b in zip(previous, values, strict=True)]
    return found


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    delta = {k: after[k] - before[k] for k in after if k != "per_position"}
    previous = before["per_position"] or [0] * len(after["per_position"])
    delta["per_position"] = [a - b for a, b in zip(after["per_position"], previous, strict=True)]
    drafts, draft_tokens = delta["spec_decode_num_drafts"], delta["spec_decode_num_draft_tokens"]
    accepted = delta["spec_decode_num_accepted_tokens"]
    delta["acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
    delta["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    delta["accepted_per_position"] = [round(n / drafts, 4) for n in delta["per_position"]] if drafts else []
    return delta


async def _one(engine: Any, ids: list[int], params: Any) -> dict[str, Any]:
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    first: float | None = None
    tokens: list[int] = []
    async for output in engine.generate(TokensPrompt(prompt_token_ids=ids), params, str(uuid.uuid4())):
        if first is None and output.outputs[0].token_ids:
            first = time.perf_counter()
        tokens = list(output.outputs[0].token_ids)
    ended = time.perf_counter()
    ttft = (first or ended) - started
    return {
        "token_ids": tokens,
        "ttft_s": ttft,
        "tpot_s": (ended - (first or ended)) / max(1, len(tokens) - 1),
        "seconds": ended - started,
    }


class EngineProcesses:
    """This engine's own processes (EngineCore, its workers), stopped while the other engines of a turn group
    take their turn.

    An idle engine is not idle: its worker busy-loops on vLLM's shared-memory queue for 1 s after its last
    step (SpinCondition, vllm/distributed/device_communicators/shm_broadcast.py) and its OpenMP threads spin
    for KMP_BLOCKTIME, taking a core from the engine whose turn it is. A pause before each turn only shortens
    that (1.5 s still left the standard engine at 23 tok/s in turns against 27 alone); SIGSTOP ends it.
    """

    def __init__(self) -> None:
        self._stopped: list[Any] = []

    def stop(self) -> None:
        import psutil

        if self._stopped:
            return
        for child in psutil.Process().children(recursive=True):
            try:
                child.send_signal(signal.SIGSTOP)
                self._stopped.append(child)
            except psutil.NoSuchProcess:
                continue

    def resume(self) -> None:
        import psutil

        for child in self._stopped:
            try:
                child.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                continue
        self._stopped = []


async def _in_turn(
    engine: Any, prompts: list[list[int]], params: Any, turns: dict[str, Any]
) -> dict[int, dict[str, Any]]:
    """One request at a time, request j at turn ``j * parties + party`` of the group's shared counter. The
    engine's processes are stopped outside its turns and after its last one, until every engine of the
    group is done: nothing it does (spinning, shutting down) runs in another engine's turn."""
    directory, parties, party = Path(turns["dir"]), int(turns["parties"]), int(turns["party"])
    processes = EngineProcesses()
    results: dict[int, dict[str, Any]] = {}
    try:
        for index, ids in enumerate(prompts):
            turn = index * parties + party
            if _current_turn(directory) != turn:
                processes.stop()
            await wait_for_turn(directory, turn)
            processes.resume()
            await asyncio.sleep(float(turns["settle_s"]))
            results[index] = await _one(engine, ids, params)
            processes.stop()
            pass_turn(directory, turn + 1)
        await wait_for_turn(directory, len(prompts) * parties)
    finally:
        processes.resume()
    return results


async def _phase(
    engine: Any, prompts: list[list[int]], streams: int, max_tokens: int, turns: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``len(prompts)`` requests, ``streams`` in flight at a time (a new one starts as one ends).

    With ``turns`` (one stream only) request j waits for turn ``j * parties + party``: the phase's time is
    the sum of its own requests' times, not the wall clock that includes the other engines' turns.
    """
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=False)
    queue = list(enumerate(prompts))
    results: dict[int, dict[str, Any]] = {}

    async def worker() -> None:
        while queue:
            index, ids = queue.pop(0)
            results[index] = await _one(engine, ids, params)

    started = time.perf_counter()
    if turns is None:
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    else:
        if streams != 1:
            raise ValueError(f"engines take turns one request at a time, not at {streams} streams")
        results = await _in_turn(engine, prompts, params, turns)
        elapsed = sum(r["seconds"] for r in results.values())
    ordered = [results[i] for i in range(len(prompts))]
    generated = sum(len(r["token_ids"]) for r in ordered)
    return {
        "seconds": elapsed,
        "generated_tokens": generated,
        "tokens_per_s": generated / elapsed,
        "requests": ordered,
    }


#: Written by :mod:`bench.fast` beside the barrier and turn files when one engine of a group failed.
ABORT_FILE = "abort"


def _check_abort(directory: Path) -> None:
    if (directory.parent / ABORT_FILE).exists():
        raise RuntimeError("another engine of this group failed; giving up")


async def wait_for_peers(directory: Path, parties: int, timeout_s: float = 900.0) -> None:
    """Wait until ``parties`` engine processes (this one included) are warm, so engines that share the host
    time their phases over the same interval rather than over their staggered start-ups."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ready-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob("ready-*"))) < parties:
        _check_abort(directory)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(list(directory.glob('ready-*')))} of {parties} engines became ready"
            )
        await asyncio.sleep(0.05)


def _current_turn(directory: Path) -> int:
    try:
        return int((directory / "turn").read_text())
    except (FileNotFoundError, ValueError):  # not written yet, or caught between write and rename
        return 0


async def wait_for_turn(directory: Path, turn: int, timeout_s: float = 900.0) -> None:
    """Wait until the shared turn counter in ``directory`` reaches ``turn`` (it starts at 0)."""
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while _current_turn(directory) != turn:
        _check_abort(directory)
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {turn} never came (the counter is at {_current_turn(directory)})")
        await asyncio.sleep(0.01)


def pass_turn(directory: Path, turn: int) -> None:
    """Set the shared turn counter to ``turn`` atomically (write, then rename)."""
    scratch = directory / f"turn.{uuid.uuid4().hex}"
    scratch.write_text(str(turn))
    scratch.replace(directory / "turn")


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.reader import get_metrics_snapshot

    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec["engine"], disable_log_stats=False))
    result: dict[str, Any] = {"engine_start_s": time.perf_counter() - started, "phases": {}}
    prompts: list[list[int]] = spec["prompts"]
    warm = SamplingParams(temperature=0.0, max_tokens=8)
    await asyncio.gather(*(_one(engine, ids, warm) for ids in prompts[:2]))
    if spec.get("start_barrier"):
        await wait_for_peers(Path(spec["start_barrier"]["dir"]), int(spec["start_barrier"]["parties"]))
    speculative = bool(spec["engine"].get("speculative_config"))
    try:
        for phase in spec["phases"]:
            before = _spec_counters(get_metrics_snapshot()) if speculative else None
            measured = await _phase(
                engine, prompts[: phase["requests"]], phase["streams"], spec["max_tokens"], spec.get("turns")
            )
            measured["streams"] = phase["streams"]
            if before is not None:
                measured["spec_decode"] = _delta(_spec_counters(get_metrics_snapshot()), before)
            result["phases"][phase["name"]] = measured
    finally:
        _shut_down(engine)
    return result


def _shut_down(engine: Any) -> None:
    """Stop ``engine``. vLLM's shutdown walks the engine's process tree with psutil and raises
    NoSuchProcess when a child exits between listing and naming it (seen with several engines stopping at
    once); the engine is gone either way, so that race must not throw away a finished measurement."""
    import psutil

    try:
        engine.shutdown()
    except psutil.NoSuchProcess as error:
        print(f"engine shutdown: {error} (already exited)", file=sys.stderr)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(measure(spec))
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
