"""A vLLM ``custom_class`` proposer that drafts with perfect knowledge: the ceiling of speculative decoding.

It replays the target's own greedy continuation, computed beforehand by the standard engine and passed
in the file named by ``TANDEM_ORACLE_FILE`` (a JSON list of full token sequences, prompt + completion).
Every draft token is then accepted, so fast/standard with this proposer is the best ratio the engine
allows at a given k: what remains is the cost of verifying k+1 tokens per step.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

CONTEXT = 16  # trailing tokens that, with the length, identify a position in one reference sequence


class OracleProposer:
    """Proposes the next k tokens of the reference sequence whose prefix the request has followed."""

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        sequences: list[list[int]] = json.loads(open(os.environ["TANDEM_ORACLE_FILE"]).read())
        self.next_tokens: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for sequence in sequences:
            for end in range(1, len(sequence)):
                key = (end, tuple(sequence[max(0, end - CONTEXT) : end]))
                self.next_tokens.setdefault(key, sequence[end : end + self.k])

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                drafts.append([])
                continue
            end = int(num_tokens_no_spec[i])
            key = (end, tuple(int(t) for t in token_ids_cpu[i, max(0, end - CONTEXT) : end]))
            drafts.append(list(self.next_tokens.get(key, [])))
        return drafts

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the drafts come from the reference file."""
