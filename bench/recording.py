"""Where benchmark results go: ``<name>-<timestamp>.json`` and ``<name>-latest.json`` (+ ``.md``), and the
checkpoint of a long benchmark's finished stages."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from infra.config import write_json

T = TypeVar("T")


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


class StageCheckpoint:
    """The finished stages of a long benchmark, kept in ``<directory>/<name>-partial-<key>.json`` (``key``
    hashes everything that decides the result), so a rerun of the same configuration after a crash or a
    kill starts where it stopped rather than from the first engine. :meth:`finish` removes the file once
    the result is written."""

    def __init__(self, directory: Path, name: str, identity: dict[str, Any]) -> None:
        key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]
        self.path = directory / f"{name}-partial-{key}.json"
        self.stages: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def run(self, stage: str, work: Callable[[], T]) -> T:
        """``stage``'s recorded result, or ``work()``'s, recorded before it is returned."""
        if stage in self.stages:
            return cast(T, self.stages[stage])
        value = work()
        self.stages[stage] = value
        write_json(self.path, self.stages)
        return value

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
