"""The bundled chat prompt set (``data/prompts.jsonl``) with a fixed train / held-out split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from distill.errors import DistillError

BUNDLED_PROMPTS = Path(__file__).parent / "data" / "prompts.jsonl"


def load_prompts(path: Path | None = None, split: Literal["train", "heldout"] | None = None) -> list[str]:
    """Prompts from a JSONL file of ``{"prompt": str, "split": "train"|"heldout"}`` rows.

    Rows without a split count as training prompts. Held-out prompts are never trained on.
    """
    source = Path(path or BUNDLED_PROMPTS)
    prompts: list[str] = []
    try:
        lines = source.read_text().splitlines()
    except OSError as exc:
        raise DistillError(f"{source}: cannot read prompts: {exc.strerror}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DistillError(f"{source}:{number}: not valid JSON: {exc.msg}") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise DistillError(f"{source}:{number}: expected an object with a string 'prompt' field")
        if split is None or row.get("split", "train") == split:
            prompts.append(row["prompt"])
    if not prompts:
        raise DistillError(f"{source}: no prompts for split {split!r}")
    return prompts
