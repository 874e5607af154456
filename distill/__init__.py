"""Drafts for the fast tier: EAGLE-3 heads trained on the target's own outputs (the default), and
layer-subset drafts distilled on-policy; acceptance and the choice of k."""

from distill.acceptance import AcceptanceReport, measure_acceptance, measure_cost_ratio
from distill.api import distill_draft, latest_draft_for
from distill.config import DistillConfig
from distill.draft_init import build_layer_subset_draft, check_same_tokenizer, spread_layers
from distill.eagle3.api import train_eagle3_head
from distill.eagle3.config import Eagle3Config
from distill.errors import CheckpointError, DistillError, TokenizerMismatch
from distill.speculation import (
    SpeculationChoice,
    choose_num_speculative_tokens,
    expected_speedup,
    expected_tokens_per_step,
)

__all__ = [
    "AcceptanceReport",
    "CheckpointError",
    "DistillConfig",
    "DistillError",
    "Eagle3Config",
    "SpeculationChoice",
    "TokenizerMismatch",
    "build_layer_subset_draft",
    "check_same_tokenizer",
    "choose_num_speculative_tokens",
    "distill_draft",
    "expected_speedup",
    "expected_tokens_per_step",
    "latest_draft_for",
    "measure_acceptance",
    "measure_cost_ratio",
    "spread_layers",
    "train_eagle3_head",
]
