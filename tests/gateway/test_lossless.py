"""The fast tier is lossless: greedy decoding gives the same tokens as the standard tier (float32)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.conftest import Gateway
from tests.gateway.prompts import LOSSLESS_PROMPTS

pytestmark = pytest.mark.integration


def _greedy_token_ids(client: openai.OpenAI, model: str, prompt: str) -> tuple[list[int], str]:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=48,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    token_ids = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
    assert token_ids, "the engine did not return token ids"
    return list(token_ids), choice.message.content or ""


@pytest.mark.parametrize("concurrency", [1, 8], ids=["one-at-a-time", "batched"])
def test_fast_tier_is_token_identical(gateway: Gateway, concurrency: int) -> None:
    client = openai.OpenAI(base_url=gateway.openai_url, api_key=gateway.api_key, timeout=600, max_retries=0)
    with ThreadPoolExecutor(concurrency) as pool:
        standard = list(pool.map(lambda p: _greedy_token_ids(client, "tandem-standard", p), LOSSLESS_PROMPTS))
        fast = list(pool.map(lambda p: _greedy_token_ids(client, "tandem-fast", p), LOSSLESS_PROMPTS))
    mismatches = [
        (prompt, s_text, f_text)
        for prompt, (s_ids, s_text), (f_ids, f_text) in zip(LOSSLESS_PROMPTS, standard, fast, strict=True)
        if s_ids != f_ids
    ]
    assert not mismatches, f"{len(mismatches)}/20 prompts differ: {mismatches[:3]}"
