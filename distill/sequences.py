"""Batching chat prompts, sampling continuations and scoring completion positions with a causal LM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class CompletionBatch:
    """Left-padded prompts followed by continuations; ``completion_mask`` marks the scored tokens."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    prompt_length: int  # P, the padded prompt width
    completion_mask: torch.Tensor  # [B, T], 1 for generated tokens up to and including the first EOS

    @property
    def position_ids(self) -> torch.Tensor:
        return (self.attention_mask.cumsum(-1) - 1).clamp(min=0)


def encode_prompts(tokenizer: Any, prompts: list[str], max_prompt_tokens: int) -> dict[str, torch.Tensor]:
    """Chat-template and left-pad ``prompts`` (truncating each on the left to ``max_prompt_tokens``)."""
    rows = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        rows.append(list(ids)[-max_prompt_tokens:])
    width = max(len(r) for r in rows)
    pad = pad_token_id(tokenizer)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row) :] = torch.tensor(row)
        attention_mask[i, width - len(row) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def pad_token_id(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


@torch.no_grad()
def generate_completions(
    model: Any,
    tokenizer: Any,
    encoded: dict[str, torch.Tensor],
    max_new_tokens: int,
    *,
    sample: bool,
    temperature: float = 1.0,
) -> CompletionBatch:
    """Continue each prompt with ``model`` (sampled or greedy) and mark the tokens up to the first EOS."""
    prompt_length = encoded["input_ids"].shape[1]
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if sample
        else {"do_sample": False}
    )
    was_training = model.training
    model.eval()
    output = model.generate(
        **encoded,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens if max_new_tokens <= 1 else 1,
        pad_token_id=pad_token_id(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        **sampling,
    )
    model.train(was_training)
    completion = output[:, prompt_length:]
    if completion.shape[1] < max_new_tokens:  # every row stopped early
        filler = torch.full(
            (completion.shape[0], max_new_tokens - completion.shape[1]),
            pad_token_id(tokenizer),
            dtype=torch.long,
        )
        completion = torch.cat([completion, filler], dim=1)
    is_eos = (completion == tokenizer.eos_token_id).long()
    # Keep tokens up to and including the first EOS: eos seen *before* this position masks it out.
    seen_before = is_eos.cumsum(-1) - is_eos
    completion_mask = (seen_before == 0).long()
    input_ids = torch.cat([encoded["input_ids"], completion], dim=1)
    attention_mask = torch.cat([encoded["attention_mask"], completion_mask], dim=1)
    return CompletionBatch(input_ids, attention_mask, prompt_length, completion_mask)


def completion_logits(model: Any, batch: CompletionBatch) -> torch.Tensor:
    """Logits ``[B, T, V]`` predicting each completion token; the LM head runs only on those positions."""
    hidden = model.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    width = batch.completion_mask.shape[1]
    start = batch.prompt_length - 1
    return model.lm_head(hidden[:, start : start + width])
