"""The eval-set format the traffic family replays: ``items.jsonl`` of :class:`EvalSetItem` in an ``evalset``
artifact of the registry (written by ``tandem traffic build-set``, read here)."""

from __future__ import annotations

import json
import logging
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, ValidationError

from evalsuite.errors import EvalError
from infra.manifest import ArtifactManifest
from infra.registry import open_registry, registry_step

log = logging.getLogger(__name__)

EVALSET_KIND: Final = "evalset"
ITEMS_FILE = "items.jsonl"
SET_PREFIX = "traffic-"
Signal = Literal["json", "tool_call"]
SetSplit = Literal["dev", "test"]
SET_SPLITS: tuple[SetSplit, ...] = ("dev", "test")


class EvalSetItem(BaseModel):
    """One prompt of a private eval set: a de-identified request, replayed as it was asked."""

    id: str = Field(description="Stable id: a hash of the prompt (messages, tools, response_format).")
    split: SetSplit
    messages: list[dict[str, Any]] = Field(description="Chat messages, OpenAI shape, de-identified.")
    tools: list[dict[str, Any]] | None = Field(None, description="Tool definitions the request offered.")
    signal: Signal | None = Field(
        None,
        description="How an answer is scored automatically: 'json' (valid JSON, matching the schema if the "
        "request gave one), 'tool_call' (a call to one of the tools with schema-valid arguments), or None "
        "(no automatic score: the item goes to human review).",
    )
    period: str = Field(description="The rotation period (registry version) this item belongs to.")
    response_format: dict[str, Any] | None = Field(None, description="The request's response_format.")
    tool_choice: Any = Field(None, description="The request's tool_choice.")
    source_id: str | None = Field(None, description="Id of the captured record it came from.")


def load_set(ref: str, registry_url: str | None = None) -> tuple[ArtifactManifest, list[EvalSetItem]]:
    """The manifest and items of the eval set ``ref`` (``traffic-NAME@PERIOD``; no period: the newest).

    Raises ArtifactNotFound for an unknown set and EvalError for an artifact that is not an eval set.
    """
    registry = open_registry(registry_url)
    with registry_step(f"reading eval set {ref}"):
        manifest = registry.manifest(ref)
        if manifest.kind != EVALSET_KIND:
            raise EvalError(
                f"{manifest.ref} is a {manifest.kind!r} artifact, not an eval set ({EVALSET_KIND!r})"
            )
        root = registry.fetch(manifest.ref)
    path = root / ITEMS_FILE
    if not path.is_file():
        raise EvalError(f"eval set {manifest.ref} has no {ITEMS_FILE}")
    items = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(EvalSetItem.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise EvalError(
                f"eval set {manifest.ref}: {ITEMS_FILE} line {number} is not an item: {exc}"
            ) from exc
    log.info("event=evalset_loaded ref=%s items=%d", manifest.ref, len(items))
    return manifest, items
