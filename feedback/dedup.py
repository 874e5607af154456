"""Near-duplicate prompts, found with MinHash LSH (``datasketch``).

A prompt's text is its messages' roles and contents (and its tools' names), lower-cased with whitespace
collapsed; its shingles are character 5-grams (robust for short prompts, where one changed word would
remove a large share of word n-grams). LSH proposes candidates above the Jaccard threshold; each
candidate is confirmed on the exact Jaccard similarity of the shingle sets, so LSH's rare false positives
never drop a distinct prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datasketch import MinHash, MinHashLSH

DEFAULT_THRESHOLD = 0.8
NUM_PERM = 128
SHINGLE_CHARS = 5
_MINHASH_SEED = 1  # fixed: the same prompts always hash the same, run after run


def prompt_text(
    messages: Iterable[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]] | None = None
) -> str:
    """The text a prompt is compared on: roles, text contents and tool names, normalised."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
        parts.append(f"{message.get('role', '')}: {content or ''}")
    names = sorted(str((t.get("function") or {}).get("name") or "") for t in tools or [])
    if names:
        parts.append("tools: " + " ".join(names))
    return " ".join(" ".join(parts).lower().split())


def shingles(text: str) -> set[str]:
    """Character 5-grams of ``text`` (the whole text when it is shorter)."""
    if len(text) < SHINGLE_CHARS:
        return {text} if text else set()
    return {text[i : i + SHINGLE_CHARS] for i in range(len(text) - SHINGLE_CHARS + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass
class NearDuplicateIndex:
    """Prompts seen so far; :meth:`add` keeps a prompt only when no near-duplicate is already in."""

    threshold: float = DEFAULT_THRESHOLD
    _lsh: MinHashLSH = field(init=False)
    _shingles: dict[str, set[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"near-duplicate threshold must be between 0 and 1, got {self.threshold}")
        self._lsh = MinHashLSH(threshold=self.threshold, num_perm=NUM_PERM)

    def duplicate_of(self, text: str) -> str | None:
        """The key of an indexed prompt ``text`` nearly duplicates, or None."""
        grams = shingles(text)
        for key in self._lsh.query(_minhash(grams)):
            if jaccard(grams, self._shingles[key]) >= self.threshold:
                return str(key)
        return None

    def add(self, key: str, text: str) -> str | None:
        """Index ``text`` under ``key`` unless it nearly duplicates an indexed prompt; returns that prompt's
        key (and indexes nothing) when it does."""
        duplicate = self.duplicate_of(text)
        if duplicate is not None:
            return duplicate
        grams = shingles(text)
        self._lsh.insert(key, _minhash(grams))
        self._shingles[key] = grams
        return None


def _minhash(grams: set[str]) -> MinHash:
    minhash = MinHash(num_perm=NUM_PERM, seed=_MINHASH_SEED)
    for gram in sorted(grams):
        minhash.update(gram.encode())
    return minhash
