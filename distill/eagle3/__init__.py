"""EAGLE-3 draft heads for the fast tier: trained on the target's own greedy outputs, served by vLLM."""

from distill.eagle3.api import train_eagle3_head
from distill.eagle3.config import Eagle3Config
from distill.eagle3.head import Eagle3Head, HeadShape, is_eagle3_dir
from distill.eagle3.training import AcceptanceEstimate

__all__ = [
    "AcceptanceEstimate",
    "Eagle3Config",
    "Eagle3Head",
    "HeadShape",
    "is_eagle3_dir",
    "train_eagle3_head",
]
