"""Where benchmark results go: ``<name>-<timestamp>.json`` and ``<name>-latest.json`` (+ ``.md``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def write_result(result: dict[str, Any], directory: Path, name: str, markdown: str | None = None) -> Path:
    """Write ``<name>-<timestamp>.json`` and ``<name>-latest.json`` under ``directory``, and
    ``<name>-latest.md`` when ``markdown`` is given (the README table of the result)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{name}-{stamp}.json"
    text = json.dumps(result, indent=2)
    path.write_text(text)
    (directory / f"{name}-latest.json").write_text(text)
    if markdown is not None:
        (directory / f"{name}-latest.md").write_text(markdown)
    return path
