"""Shared machinery of the generators: drafts, the seeded stream and split assignment by content hash."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from evalsuite.schema import Difficulty, TerminalCheck


class Draft(BaseModel):
    """What a task-type builder returns: an instance before it gets an id, a split and a seed."""

    task_type: str
    prompt: str
    expected: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    hidden_files: dict[str, str] = Field(default_factory=dict)
    checks: list[TerminalCheck] = Field(default_factory=list)
    max_steps: int = 20
    metadata: dict[str, Any] = Field(default_factory=dict)

    def content(self) -> dict[str, Any]:
        """The part of the draft that identifies it (hashing decides its id and split)."""
        return self.model_dump(exclude={"metadata", "max_steps"})


Builder = Callable[[random.Random, Difficulty], Draft]


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts, stable across Python versions and processes (unlike hash())."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


WORDS = (
    "alpha bravo cedar delta ember falcon granite harbor indigo juniper kestrel lantern meadow nickel "
    "orchid pepper quartz raven saffron timber umber violet willow xenon yarrow zephyr amber basil "
    "cobalt dune"
).split()
FIRST_NAMES = (
    "Ada Bruno Chiara Dmitri Elena Farid Greta Hiro Ines Jonas Kira Luca Mei Nadia Omar Priya Quinn "
    "Rosa Sven Tariq Uma Viktor Wen Ximena Yusuf Zoe"
).split()
LAST_NAMES = (
    "Almeida Brandt Costa Dubois Eriksen Fischer Garcia Horvat Ito Jensen Kowalski Larsen Moreau "
    "Novak Okafor Petrov Quist Rossi Schmidt Tanaka Ueda Vargas Weber Xu Yilmaz Zimmer"
).split()
COUNTRIES = ("DE", "FR", "IT", "ES", "NL", "PL", "SE", "PT")
CITIES = ("Berlin", "Lyon", "Turin", "Seville", "Utrecht", "Gdansk", "Malmo", "Porto", "Ghent", "Graz")


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def company(rng: random.Random) -> str:
    suffix = rng.choice(("GmbH", "SAS", "S.p.A.", "B.V.", "Ltd", "AB", "S.L."))
    return f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()} {suffix}"
