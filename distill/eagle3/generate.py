"""Batch generation with vLLM into resumable shards: the target's own outputs are the head's training data.

The engine runs in a child process (``python -m distill.eagle3.generate <spec.json>``), as vLLM spawns
processes and holds memory that training needs afterwards. Each shard of prompts becomes one JSONL file
written atomically, so a killed run loses at most the shard in flight and the same call resumes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from distill.errors import DistillError
from infra.cpu_engine import cpu_engine_env

log = logging.getLogger(__name__)


class GenerationJob(BaseModel):
    """Chat prompts in, one JSONL shard per ``shard_size`` prompts out (under ``out_dir``)."""

    prompts: list[str]
    out_dir: Path
    shard_size: int = Field(256, ge=1)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy, what the served tiers verify against.")


class GenerationSpec(BaseModel):
    """Jobs run one after another on one vLLM engine (an engine start costs more than a small job)."""

    model: str = Field(description="Target model directory (HF format).")
    jobs: list[GenerationJob]
    seed: int = 0
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Engine dtype; the served tiers' dtype, so data matches them."
    )
    max_num_seqs: int = Field(64, ge=1)
    max_model_len: int = Field(2048, ge=128)
    kv_cache_memory_bytes: int = Field(2 << 30, description="Explicit KV budget (vLLM CPU).")
    device: str = Field("auto", description="vLLM device: auto, cpu or cuda.")


def shard_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"shard-{index:05d}.jsonl"


def num_shards(job: GenerationJob) -> int:
    return (len(job.prompts) + job.shard_size - 1) // job.shard_size


def _pending(job: GenerationJob) -> list[int]:
    return [i for i in range(num_shards(job)) if not shard_path(job.out_dir, i).is_file()]


def read_shards(job: GenerationJob) -> list[dict[str, Any]]:
    """The finished rows of ``job``'s prompts, in order: a directory grown by a larger run may hold more."""
    rows: list[dict[str, Any]] = []
    for index in range(num_shards(job)):
        path = shard_path(job.out_dir, index)
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[: len(job.prompts)]


def _chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    ids: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _worker(spec: GenerationSpec) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if not any(_pending(job) for job in spec.jobs):
        return
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    llm = LLM(
        model=spec.model,
        dtype=spec.dtype,
        enforce_eager=True,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
        seed=spec.seed,
    )
    for job in spec.jobs:
        for index in _pending(job):
            prompts = job.prompts[index * job.shard_size : (index + 1) * job.shard_size]
            prompt_ids = [_chat_ids(tokenizer, p)[: spec.max_model_len - job.max_tokens] for p in prompts]
            params = [
                SamplingParams(
                    temperature=job.temperature,
                    max_tokens=job.max_tokens,
                    seed=spec.seed + index * 100_000 + n,
                )
                for n in range(len(prompts))
            ]
            outputs = llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False
            )
            rows = [
                {
                    "prompt": prompt,
                    "prompt_ids": ids,
                    "output_ids": list(out.outputs[0].token_ids),
                    "text": out.outputs[0].text,
                }
                for prompt, ids, out in zip(prompts, prompt_ids, outputs, strict=True)
            ]
            target = shard_path(job.out_dir, index)
            partial = target.with_suffix(".partial")
            partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
            partial.replace(target)


def _check_resumable(job: GenerationJob) -> None:
    """A finished shard must hold this job's prompts, or resuming would mix two data sets.

    A shard with fewer rows than its slice is the last shard of a smaller earlier run (the prompt list
    has grown since): it is removed, so the slice is generated again whole.
    """
    for index in range(num_shards(job)):
        path = shard_path(job.out_dir, index)
        if path.is_file():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            expected = job.prompts[index * job.shard_size : (index + 1) * job.shard_size]
            if not lines or json.loads(lines[0])["prompt"] != expected[0]:
                raise DistillError(
                    f"{path}: generated from other prompts than this run's; use another work directory"
                )
            if len(lines) < len(expected):
                log.info("event=shard_regenerate path=%s rows=%d wanted=%d", path, len(lines), len(expected))
                path.unlink()


def generate(
    spec: GenerationSpec,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    timeout_s: float = 6 * 3600,
) -> list[list[dict[str, Any]]]:
    """Run ``spec`` in a child vLLM process (resuming finished shards); return each job's rows.

    ``progress(job_dir_name, done_shards, total_shards)`` is called as shards land.
    """
    for job in spec.jobs:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        _check_resumable(job)
        (job.out_dir / "job.json").write_text(
            job.model_dump_json(include={"shard_size", "max_tokens", "temperature"})
        )

    def report() -> None:
        if progress:
            for job in spec.jobs:
                progress(job.out_dir.name, num_shards(job) - len(_pending(job)), num_shards(job))

    if any(_pending(job) for job in spec.jobs):
        home = spec.jobs[0].out_dir.parent
        spec_file, log_path = home / "generation-spec.json", home / "generation-engine.log"
        spec_file.write_text(spec.model_dump_json())
        # The served tiers' CPU engine environment (Intel OpenMP, model threads on every core).
        tuned = cpu_engine_env()
        with log_path.open("ab") as engine_log:
            child = subprocess.Popen(
                [sys.executable, "-m", "distill.eagle3.generate", str(spec_file)],
                stdout=engine_log,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    **tuned,
                    "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                },
            )
            started = time.monotonic()
            try:
                while child.poll() is None:
                    report()
                    if time.monotonic() - started > timeout_s:
                        child.kill()
                        raise DistillError(f"generation exceeded {timeout_s:.0f} s; rerun to resume")
                    time.sleep(2.0)
            finally:
                if child.poll() is None:
                    child.terminate()
                    child.wait(30)
        missing = [job.out_dir.name for job in spec.jobs if _pending(job)]
        if child.returncode != 0 or missing:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise DistillError(
                f"vLLM generation failed (exit {child.returncode}, unfinished: {missing}): {tail}"
            )
    report()
    return [read_shards(job) for job in spec.jobs]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _worker(GenerationSpec.model_validate_json(Path(sys.argv[1]).read_text()))
