"""Policies that play episodes: the reference solution (SFT demonstrations), a local model (held-out measurement,
single-process training) and a vLLM rollout engine on Ray (GRPO)."""

from __future__ import annotations

from typing import Any

from posttrain.episodes.environments import CallRecord
from posttrain.episodes.loop import Generation
from posttrain.episodes.transcript import TranscriptRenderer


class ReferencePolicy:
    """Answers with the generator's reference solution, one turn of tool calls at a time, then a closing reply;
    each turn is the template's own rendering of that assistant message (Hermes ``<tool_call>`` blocks)."""

    def __init__(
        self, renderer: TranscriptRenderer, turns: list[list[CallRecord]], closing_reply: str
    ) -> None:
        self.renderer = renderer
        self.messages: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                    for call in turn
                ],
            }
            for turn in turns
        ]
        self.messages.append({"role": "assistant", "content": closing_reply})
        self.turn = 0

    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Generation:
        message = self.messages[min(self.turn, len(self.messages) - 1)]
        self.turn += 1
        ids = self.renderer.assistant_ids(message)[:max_tokens]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids))


class LocalModelPolicy:
    """A Hugging Face model in this process: greedy when ``temperature`` is None, else sampled (each turn
    seeded); log-probs under the processed distribution it sampled from."""

    def __init__(
        self,
        model: Any,
        eos_id: int,
        pad_id: int | None,
        temperature: float | None = None,
        top_k: int | None = None,
    ) -> None:
        self.model = model
        self.eos_id = eos_id
        self.pad_id = pad_id if pad_id is not None else eos_id
        self.temperature = temperature
        self.top_k = top_k

    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Generation:
        import torch

        device = next(self.model.parameters()).device
        inputs = torch.tensor([prompt_ids], device=device)
        options: dict[str, Any] = {"do_sample": False}
        if self.temperature is not None:
            torch.manual_seed(seed % (2**32))
            options = {
                "do_sample": True,
                "temperature": self.temperature,
                "top_k": self.top_k or 0,
                "top_p": 1.0,
            }
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(  # type: ignore[operator]
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=max_tokens,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
                return_dict_in_generate=True,
                output_scores=True,
                **options,
            )
        if was_training:
            self.model.train()
        ids = [int(token) for token in out.sequences[0, len(prompt_ids) :]]
        logprobs = [
            float(torch.log_softmax(score[0].float(), dim=-1)[token])
            for score, token in zip(out.scores, ids, strict=False)
        ]
        return Generation(token_ids=ids, logprobs=logprobs)


class EnginePolicy:
    """A vLLM rollout engine (a :class:`~posttrain.distributed.engines.RolloutEngine` actor handle): one
    completion per turn with the run's sampling settings; the engine reports the policy version it sampled."""

    def __init__(self, handle: Any, sampling: dict[str, Any]) -> None:
        self.handle = handle
        self.sampling = {key: value for key, value in sampling.items() if key not in ("n", "max_tokens")}

    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Generation:
        (completions,) = await self.handle.generate.remote(
            [prompt_ids], {**self.sampling, "n": 1, "max_tokens": max_tokens}, seed
        )
        completion = completions[0]
        return Generation(
            token_ids=list(completion["token_ids"]),
            logprobs=list(completion["logprobs"]),
            policy_version=int(completion["policy_version"]),
        )
