"""The data every generator produces and every verifier consumes.

These models are the contract between the eval suite and post-training (which imports the verifiers as RL
rewards); fields are only ever added, never renamed or removed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _registered(name: str) -> str:
    from evalsuite.registry import family_names

    if name not in family_names():
        raise ValueError(f"unknown family {name!r} (allowed: {', '.join(family_names())})")
    return name


# A family is any name in the registry (evalsuite.registry), not a fixed list: families register themselves.
Family = Annotated[str, AfterValidator(_registered)]
Split = Literal["train", "dev", "test"]
Difficulty = Literal["easy", "medium", "hard"]

SPLITS: tuple[Split, ...] = ("train", "dev", "test")
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")


class TerminalCheck(BaseModel):
    """One check run inside the sandbox after the agent finishes.

    ``command`` runs with bash in the working tree; the check passes when the exit code is 0 and, if
    ``expected_stdout`` is set, the stripped stdout equals it exactly.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    command: str
    expected_stdout: str | None = None
    weight: float = 1.0


class TaskInstance(BaseModel):
    """One generated, self-contained evaluation item.

    ``expected`` holds what the verifier needs (answer, goal state, checks); ``files`` are written into the
    sandbox working tree before the model starts; ``hidden_files`` are written only at scoring time so the
    model never sees them.
    """

    model_config = ConfigDict(frozen=True)

    instance_id: str = Field(description="Stable id: hash of family, task type and content.")
    family: Family
    task_type: str
    difficulty: Difficulty
    split: Split
    seed: int = Field(description="Seed of the random stream that produced this instance.")
    prompt: str
    expected: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    hidden_files: dict[str, str] = Field(default_factory=dict)
    checks: list[TerminalCheck] = Field(default_factory=list)
    max_steps: int = Field(default=20, description="Budget of model turns / tool calls.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class VerifierResult(BaseModel):
    """Outcome of verifying one completion: a reward in [0, 1] plus why."""

    score: float = Field(ge=0.0, le=1.0)
    correct: bool
    components: dict[str, float] = Field(default_factory=dict)
    explanation: str = ""


def content_digest(family: str, task_type: str, content: Any) -> str:
    """Hex sha256 of the canonical JSON of an instance's content; decides its id and its split."""
    payload = json.dumps([family, task_type, content], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


# Fractions of the content-hash space per split; the split is a pure function of the content, so the
# splits are disjoint by construction whatever seeds or rotation keys are used.
SPLIT_BOUNDARIES: dict[Split, tuple[int, int]] = {"train": (0, 80), "dev": (80, 90), "test": (90, 100)}


def split_of(digest: str) -> Split:
    """Which split a content digest belongs to (80 % train, 10 % dev, 10 % test)."""
    bucket = int(digest[:8], 16) % 100
    for split, (low, high) in SPLIT_BOUNDARIES.items():
        if low <= bucket < high:
            return split
    raise AssertionError("unreachable: buckets cover 0..99")
