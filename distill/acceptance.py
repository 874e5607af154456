"""Offline acceptance: how often the draft's proposals would survive the teacher's verification.

Measured on the teacher's own greedy continuations of held-out prompts, the prefixes a speculative engine
actually drafts from. Two numbers per token: the expected acceptance of speculative sampling,
``sum_v min(p_v, q_v)``, and greedy agreement (the draft's argmax equals the teacher's), which is what
greedy (temperature 0) verification accepts.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from pydantic import BaseModel

from distill.divergence import expected_acceptance
from distill.sequences import CompletionBatch, completion_logits, encode_prompts, generate_completions


class AcceptanceReport(BaseModel):
    """Mean per-token acceptance over the scored completion tokens."""

    expected_acceptance: float
    greedy_agreement: float
    tokens: int


def build_eval_batches(
    teacher: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    new_tokens: int,
    max_prompt_tokens: int,
    batch_size: int = 8,
) -> list[CompletionBatch]:
    """Teacher greedy continuations of ``prompts``, batched; computed once and reused for every evaluation."""
    batches = []
    for start in range(0, len(prompts), batch_size):
        encoded = encode_prompts(tokenizer, prompts[start : start + batch_size], max_prompt_tokens)
        batches.append(generate_completions(teacher, tokenizer, encoded, new_tokens, sample=False))
    return batches


@torch.no_grad()
def measure_acceptance(
    teacher: Any, draft: Any, batches: list[CompletionBatch], *, autocast_dtype: torch.dtype | None = None
) -> AcceptanceReport:
    """Token-weighted mean acceptance of ``draft`` against ``teacher`` over ``batches``."""
    total_expected = 0.0
    total_greedy = 0.0
    count = 0
    was_training = draft.training
    draft.eval()
    for batch in batches:
        device = next(draft.parameters()).device.type
        with torch.autocast(
            device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
        ):
            teacher_logits = completion_logits(teacher, batch)
            draft_logits = completion_logits(draft, batch)
        mask = batch.completion_mask.bool()
        total_expected += expected_acceptance(teacher_logits[mask], draft_logits[mask]).sum().item()
        total_greedy += (teacher_logits[mask].argmax(-1) == draft_logits[mask].argmax(-1)).sum().item()
        count += int(mask.sum().item())
    draft.train(was_training)
    return AcceptanceReport(
        expected_acceptance=total_expected / max(count, 1),
        greedy_agreement=total_greedy / max(count, 1),
        tokens=count,
    )


@torch.no_grad()
def measure_cost_ratio(teacher: Any, draft: Any, *, steps: int = 24, context: int = 64) -> float:
    """Draft/teacher time per single-token decode step (batch 1, KV cache), median of ``steps``."""

    def step_time(model: Any) -> float:
        ids = torch.randint(3, int(model.config.vocab_size), (1, context))
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
        return sorted(times)[len(times) // 2]

    teacher.eval()
    draft.eval()
    step_time(draft)  # warm-up
    return step_time(draft) / step_time(teacher)
