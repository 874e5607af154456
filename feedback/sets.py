"""Private, rotating eval sets built from captured gateway traffic (``tandem traffic build-set``).

A set is built from the de-identified exchanges the gateway captured in a window (:func:`gateway.capture.
read_records`): near-duplicate prompts are removed (MinHash LSH, :mod:`feedback.dedup`), every prompt that
nearly duplicates an item of an earlier period of the same set is left out (rotation: each period is a new
sample, and the earlier ones are retired), the rest are split dev/test with a seeded shuffle, and the set is
published to the registry as ``traffic-<NAME>@<PERIOD>`` (kind ``evalset``, file ``items.jsonl``).

A period label is a registry version; ``2026-11`` (a month), ``2026-q4`` (a quarter), ``2026-w47`` (an ISO
week), ``2026-11-20`` (a day) and ``2026`` (a year) also give the window, otherwise pass ``since``/``until``.
The ``traffic`` eval family (:mod:`evalsuite.families.traffic`) replays a set against a model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import tempfile
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evalsuite.families.traffic import EVALSET_KIND, ITEMS_FILE, SET_PREFIX, EvalSetItem, Signal, load_set
from feedback.dedup import DEFAULT_THRESHOLD, NUM_PERM, SHINGLE_CHARS, NearDuplicateIndex, prompt_text
from feedback.errors import BadPeriod, EvalSetError, NoRecordsInWindow, UnknownSet
from gateway.capture import CapturedExchange, read_records
from infra.errors import ArtifactNotFound
from infra.manifest import ArtifactManifest, Lineage
from infra.registry import Registry, open_registry, parse_ref, registry_step

log = logging.getLogger(__name__)

__all__ = [
    "BuiltSet",
    "EvalSetItem",
    "SetVersion",
    "build_set",
    "detect_signal",
    "list_sets",
    "make_items",
    "period_window",
    "set_name",
    "split_items",
]

_VERSION = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_RETIRED_KEY = "retired:"


class BuiltSet(BaseModel):
    """What ``build-set`` published, and what it left out."""

    ref: str
    manifest: ArtifactManifest
    records: int = Field(description="Captured records in the window.")
    duplicates: int = Field(description="Near-duplicates of another record in the window, removed.")
    retired_overlap: int = Field(
        description="Prompts that nearly duplicate an earlier period's item, left out."
    )
    retired: list[str] = Field(description="Earlier periods of the set, retired by this one.")
    dev: int
    test: int


class SetVersion(BaseModel):
    """One published period of a traffic set, for ``tandem traffic list``."""

    ref: str
    name: str
    period: str
    created_at: datetime
    dev: int
    test: int
    current: bool = Field(description="The newest period of its set; earlier ones are retired.")


# -- pieces -------------------------------------------------------------------------------------------
def set_name(name: str) -> str:
    """The registry name of set ``name``: ``traffic-<name>``; EvalSetError when it is not a valid name."""
    full = name if name.startswith(SET_PREFIX) else SET_PREFIX + name
    if not _VERSION.match(full) or full == SET_PREFIX:
        raise EvalSetError(f"invalid set name {name!r}: use lowercase letters, digits, '.', '_' or '-'")
    return full


def period_window(period: str) -> tuple[datetime, datetime] | None:
    """The UTC window ``[since, until)`` a period label names (year, quarter, month, ISO week, day), or None."""
    try:
        if m := re.fullmatch(r"(\d{4})", period):
            start = date(int(m[1]), 1, 1)
            end = date(start.year + 1, 1, 1)
        elif m := re.fullmatch(r"(\d{4})-q([1-4])", period):
            start = date(int(m[1]), 3 * int(m[2]) - 2, 1)
            end = date(start.year + (start.month == 10), (start.month + 2) % 12 + 1, 1)
        elif m := re.fullmatch(r"(\d{4})-(\d{2})", period):
            start = date(int(m[1]), int(m[2]), 1)
            end = date(start.year + (start.month == 12), start.month % 12 + 1, 1)
        elif m := re.fullmatch(r"(\d{4})-w(\d{2})", period):
            start = date.fromisocalendar(int(m[1]), int(m[2]), 1)
            end = start + timedelta(days=7)
        elif m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", period):
            start = date(int(m[1]), int(m[2]), int(m[3]))
            end = start + timedelta(days=1)
        else:
            return None
    except ValueError as exc:
        raise BadPeriod(f"period {period!r} names no real date range: {exc}") from exc
    return (
        datetime(start.year, start.month, start.day, tzinfo=UTC),
        datetime(end.year, end.month, end.day, tzinfo=UTC),
    )


def detect_signal(exchange: CapturedExchange) -> Signal | None:
    """How an answer to this prompt can be scored without a person: 'json' when the request asked for JSON
    (response_format json_object / json_schema), 'tool_call' when it offered tools and the answer called
    one, else None."""
    if (exchange.response_format or {}).get("type") in ("json_object", "json_schema"):
        return "json"
    if exchange.tools and exchange.tool_calls:
        return "tool_call"
    return None


def _item_id(exchange: CapturedExchange) -> str:
    prompt = {
        "messages": exchange.messages,
        "tools": exchange.tools,
        "response_format": exchange.response_format,
    }
    return hashlib.sha256(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_items(
    records: list[CapturedExchange],
    period: str,
    earlier: list[EvalSetItem] | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
) -> tuple[list[EvalSetItem], int, int]:
    """Items (split not yet assigned: 'test') from ``records``, oldest first, without near-duplicates of
    each other or of ``earlier`` periods' items; returns them with the counts of both kinds removed."""
    index = NearDuplicateIndex(threshold)
    for item in earlier or []:
        index.add(_RETIRED_KEY + item.id, prompt_text(item.messages, item.tools))
    items: list[EvalSetItem] = []
    duplicates = retired = 0
    for record in records:
        if not record.messages:
            continue
        item_id = _item_id(record)
        found = index.add(item_id, prompt_text(record.messages, record.tools))
        if found is not None:
            retired += found.startswith(_RETIRED_KEY)
            duplicates += not found.startswith(_RETIRED_KEY)
            continue
        items.append(
            EvalSetItem(
                id=item_id,
                split="test",
                messages=record.messages,
                tools=record.tools,
                signal=detect_signal(record),
                period=period,
                response_format=record.response_format,
                tool_choice=record.tool_choice,
                source_id=record.id,
            )
        )
    return items, duplicates, retired


def split_items(items: list[EvalSetItem], *, seed: int, test_fraction: float) -> list[EvalSetItem]:
    """The items with disjoint dev/test splits: a ``seed``-ed shuffle of the items (ordered by id first, so
    the result does not depend on their order), the first ``test_fraction`` of it test, the rest dev. With
    two or more items and 0 < test_fraction < 1, neither split is empty."""
    if not 0.0 <= test_fraction <= 1.0:
        raise EvalSetError(f"test fraction must be between 0 and 1, got {test_fraction}")
    ordered = sorted(items, key=lambda item: item.id)
    random.Random(seed).shuffle(ordered)
    n_test = round(len(ordered) * test_fraction)
    if 0.0 < test_fraction < 1.0 and len(ordered) >= 2:
        n_test = min(max(n_test, 1), len(ordered) - 1)
    return sorted(
        (
            item.model_copy(update={"split": "test" if i < n_test else "dev"})
            for i, item in enumerate(ordered)
        ),
        key=lambda item: (item.split, item.id),
    )


# -- building and listing -----------------------------------------------------------------------------
def build_set(
    name: str,
    period: str,
    *,
    database_url: str,
    registry: Registry | str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    seed: int = 0,
    test_fraction: float = 0.5,
    max_items: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> BuiltSet:
    """Build and publish ``traffic-<name>@<period>`` from the records captured in the period's window; given
    ``since`` and/or ``until`` are the window instead (a missing bound is open). Raises BadPeriod,
    NoRecordsInWindow, EvalSetError (and the registry's errors)."""
    full = set_name(name)
    if not _VERSION.match(period):
        raise BadPeriod(
            f"invalid period {period!r}: use lowercase letters, digits, '.', '_' or '-' (e.g. 2026-11)"
        )
    window = period_window(period)
    if since is None and until is None and window is None:
        raise BadPeriod(
            f"period {period!r} names no window (use YYYY, YYYY-qN, YYYY-MM, YYYY-wNN or YYYY-MM-DD), "
            "so pass --since and/or --until"
        )
    if since is None and until is None and window is not None:
        since, until = window
    # Naive bounds are UTC, as the capture's timestamps are.
    since = since.replace(tzinfo=UTC) if since is not None and since.tzinfo is None else since
    until = until.replace(tzinfo=UTC) if until is not None and until.tzinfo is None else until
    if since is not None and until is not None and since >= until:
        raise BadPeriod(
            f"the window is empty: since {since.isoformat()} is not before until {until.isoformat()}"
        )
    store = registry if isinstance(registry, Registry) else open_registry(registry)
    with registry_step(f"reading the earlier periods of {full}"):
        earlier = store.versions(full)
    if any(m.version == period for m in earlier):
        raise BadPeriod(f"{full}@{period} is already published; versions are immutable, so name a new period")
    if max_items is not None and max_items < 1:
        raise EvalSetError(f"max items must be at least 1, got {max_items}")

    records = read_records(database_url, since=since, until=until)
    if not records:
        raise NoRecordsInWindow(
            f"no captured records {_describe(since, until)} in {database_url}: give keys a capture rate "
            "(`tandem keys create --capture-rate 0.1` or `tandem keys update KEY --capture-rate 0.1`) and let traffic flow"
        )
    earlier_items = [item for manifest in earlier for item in load_set(manifest.ref, store.url)[1]]
    items, duplicates, retired_overlap = make_items(records, period, earlier_items, threshold=threshold)
    if not items:
        raise NoRecordsInWindow(
            f"all {len(records)} records {_describe(since, until)} repeat prompts of earlier periods of {full} "
            f"({', '.join(m.version for m in earlier)}): nothing new for {period}"
        )
    if max_items is not None and len(items) > max_items:
        items = random.Random(seed).sample(items, max_items)
    items = split_items(items, seed=seed, test_fraction=test_fraction)
    counts = Counter(item.split for item in items)
    signals = Counter(item.signal or "none" for item in items)
    retired_refs = [m.ref for m in earlier]
    config = {
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "seed": seed,
        "test_fraction": test_fraction,
        "max_items": max_items,
        "dedup": {
            "method": "minhash-lsh",
            "threshold": threshold,
            "num_perm": NUM_PERM,
            "shingle_chars": SHINGLE_CHARS,
        },
    }
    metadata: dict[str, Any] = {
        "set": full,
        "period": period,
        "retired": retired_refs,
        "counts": {
            "records": len(records),
            "duplicates": duplicates,
            "retired_overlap": retired_overlap,
            "dev": counts["dev"],
            "test": counts["test"],
        },
        "signals": dict(signals),
        "window": {"since": config["since"], "until": config["until"]},
    }
    with tempfile.TemporaryDirectory(prefix="tandem-evalset-") as tmp:
        path = Path(tmp) / ITEMS_FILE
        path.write_text("".join(item.model_dump_json() + "\n" for item in items))
        with registry_step(f"publishing {full}@{period}"):
            manifest = store.publish(
                Path(tmp),
                full,
                period,
                kind=EVALSET_KIND,
                lineage=Lineage(parents=retired_refs, produced_by="tandem traffic build-set", config=config),
                metadata=metadata,
            )
    log.info("event=evalset_published ref=%s records=%d duplicates=%d retired_overlap=%d dev=%d test=%d",
             manifest.ref, len(records), duplicates, retired_overlap, counts["dev"], counts["test"])  # fmt: skip
    return BuiltSet(
        ref=manifest.ref,
        manifest=manifest,
        records=len(records),
        duplicates=duplicates,
        retired_overlap=retired_overlap,
        retired=retired_refs,
        dev=counts["dev"],
        test=counts["test"],
    )


def list_sets(registry: Registry | str | None = None, name: str | None = None) -> list[SetVersion]:
    """Every published period of every traffic set (or of set ``name``), oldest first within a set; the
    newest period of each set is current. UnknownSet when ``name`` has none."""
    store = registry if isinstance(registry, Registry) else open_registry(registry)
    with registry_step("listing traffic eval sets"):
        if name is not None:
            full = set_name(name)
            parse_ref(full)
            try:
                manifests = [m for m in store.versions(full) if m.kind == EVALSET_KIND]
            except ArtifactNotFound:
                manifests = []
            if not manifests:
                raise UnknownSet(
                    f"no traffic eval set named {full!r} in {store.url} (build one with `tandem traffic build-set`)"
                )
        else:
            manifests = [m for m in store.list(EVALSET_KIND) if m.name.startswith(SET_PREFIX)]
    newest: dict[str, datetime] = {}
    for manifest in manifests:
        newest[manifest.name] = max(newest.get(manifest.name, manifest.created_at), manifest.created_at)
    versions = []
    for manifest in sorted(manifests, key=lambda m: (m.name, m.created_at)):
        counts = manifest.metadata.get("counts") or {}
        versions.append(
            SetVersion(
                ref=manifest.ref,
                name=manifest.name,
                period=manifest.version,
                created_at=manifest.created_at,
                dev=int(counts.get("dev", 0)),
                test=int(counts.get("test", 0)),
                current=manifest.created_at == newest[manifest.name],
            )
        )
    return versions


def _describe(since: datetime | None, until: datetime | None) -> str:
    parts = []
    if since is not None:
        parts.append(f"from {since.isoformat()}")
    if until is not None:
        parts.append(f"until {until.isoformat()}")
    return " ".join(parts) or "at all"
