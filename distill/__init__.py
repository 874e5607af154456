"""Draft distillation for the fast tier: layer-subset init, on-policy KD, acceptance, choice of k."""

from distill.acceptance import AcceptanceReport, measure_acceptance, measure_cost_ratio
from distill.api import distill_draft, latest_draft_for
from distill.bench import run_fast_bench
from distill.config import DistillConfig
from distill.draft_init import build_layer_subset_draft, check_same_tokenizer, spread_layers
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
    "run_fast_bench",
    "spread_layers",
]
