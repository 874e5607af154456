"""The sticky stable/candidate traffic split the ingress applies, and the weights file it reads.

The rollout controller (``release.rollout_controller``) publishes :class:`TrafficWeights`; the ingress owns
their shape because it is the one that applies them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.errors import RegistryError, RolloutError
from infra.registry import parse_ref

ReleaseName = Literal["stable", "candidate"]
RELEASES: tuple[ReleaseName, ReleaseName] = ("stable", "candidate")


def assign_release(sticky_key: str, candidate_weight: int, salt: str) -> ReleaseName:
    """The release a request goes to: ``sha256(salt + key) mod 100 < candidate_weight`` -> candidate.

    Sticky: the same API key or session id always lands in the same bucket for a given salt, so a client
    sees one release throughout a step, and raising the weight only moves stable clients over (never
    back). Weight 0 sends everything to stable, 100 everything to the candidate.
    """
    if not 0 <= candidate_weight <= 100:
        raise ValueError(f"candidate_weight must be within 0..100, got {candidate_weight}")
    digest = hashlib.sha256(f"{salt}\x00{sticky_key}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    return "candidate" if bucket < candidate_weight else "stable"


def check_ref(ref: str) -> str:
    """``ref`` if it parses as a registry ref; a ValueError (for pydantic validators) otherwise."""
    try:
        parse_ref(ref)
    except RegistryError as exc:
        raise ValueError(str(exc)) from exc
    return ref


class ReleaseSpec(BaseModel):
    """One release: the target model and, for the fast tier, its draft, both as registry refs."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Registry ref of the weights, 'name@version'.")
    draft: str | None = Field(None, description="Registry ref of the fast tier's draft; none: n-gram/auto.")

    @field_validator("model", "draft")
    @classmethod
    def _valid_ref(cls, value: str | None) -> str | None:
        return None if value is None else check_ref(value)


class TrafficWeights(BaseModel):
    """The weights file the controller publishes and the ingress reads (``traffic.weights_file``)."""

    stable: int = Field(100, ge=0, le=100)
    candidate: int = Field(0, ge=0, le=100)
    salt: str = "tandem"
    releases: dict[ReleaseName, ReleaseSpec] = Field(default_factory=dict)
    updated_at: str = ""

    @model_validator(mode="after")
    def _sum_to_100(self) -> TrafficWeights:
        if self.stable + self.candidate != 100:
            raise ValueError(f"stable + candidate must be 100, got {self.stable} + {self.candidate}")
        return self

    def release_for(self, sticky_key: str) -> ReleaseName:
        """The release one API key or session id is routed to under these weights."""
        return assign_release(sticky_key, self.candidate, self.salt)


def load_traffic_weights(path: Path) -> TrafficWeights:
    """The published weights; everything on stable while no rollout has published any."""
    path = Path(path)
    if not path.is_file():
        return TrafficWeights()
    try:
        return TrafficWeights.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise RolloutError(f"{path}: unreadable traffic weights: {exc}") from exc
