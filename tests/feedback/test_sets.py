"""Private eval sets from captured traffic: near-duplicate removal, seeded disjoint splits, rotation by period,
signals, the published artifact, and clear errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsuite.families.traffic import EvalSetItem, load_set
from feedback.cli import traffic_app
from feedback.dedup import NearDuplicateIndex, prompt_text
from feedback.errors import BadPeriod, EvalSetError, NoRecordsInWindow, UnknownSet
from feedback.sets import build_set, detect_signal, list_sets, make_items, period_window, split_items
from gateway.capture import CapturedExchange, ensure_capture_schema, insert_record
from gateway.database import open_database
from infra.registry import open_registry

JANUARY = datetime(2026, 1, 10, 12, tzinfo=UTC)
FEBRUARY = datetime(2026, 2, 10, 12, tzinfo=UTC)
TOOLS = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]
TOPICS = [
    "the history of the printing press in Europe",
    "how vaccines train the immune system",
    "why the sky looks blue at noon and red at dusk",
    "the rules of chess castling",
    "how a bicycle stays upright while moving",
    "what causes ocean tides twice a day",
    "how compilers turn source code into machine code",
    "the life cycle of a monarch butterfly",
    "how bread rises when yeast ferments sugar",
    "why leap years exist in the Gregorian calendar",
]


def exchange(prompt: str, at: datetime, index: int = 0, **fields: object) -> CapturedExchange:
    return CapturedExchange.model_validate(
        {
            "id": f"rec-{at:%m%d}-{index:03d}",
            "captured_at": at + timedelta(minutes=index),
            "key_id": "tk-test0000",
            "model": "standard",
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": prompt},
            ],
            "answer": "An answer.",
        }
        | fields
    )


def explain(topic: str) -> str:
    return f"Please explain {topic} in three short paragraphs for a curious teenager."


def store(url: str, records: list[CapturedExchange]) -> None:
    database = open_database(url)
    ensure_capture_schema(database)
    for record in records:
        insert_record(database, record)
    database.close()


@pytest.fixture
def places(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "keys.db"), str(tmp_path / "registry")


# -- pieces --------------------------------------------------------------------------------------------
def test_near_duplicates_are_removed_and_distinct_prompts_kept() -> None:
    base = explain("the history of the printing press in Europe")
    records = [
        exchange(base, JANUARY, 0),
        exchange(base, JANUARY, 1),  # exact repeat
        exchange(base.replace("three short", "three brief"), JANUARY, 2),  # one word changed
        exchange(base + " ", JANUARY, 3),  # whitespace only
        *(exchange(explain(topic), JANUARY, 10 + i) for i, topic in enumerate(TOPICS[1:])),
    ]
    items, duplicates, retired = make_items(records, "2026-01")
    assert duplicates == 3 and retired == 0
    assert len(items) == len(TOPICS)
    assert items[0].source_id == "rec-0110-000"  # the first of a cluster is the one kept
    assert len({item.id for item in items}) == len(items)


def test_the_index_confirms_candidates_on_exact_jaccard() -> None:
    index = NearDuplicateIndex(0.8)
    assert index.add("a", "one two three four five six seven eight nine ten") is None
    assert index.add("b", "one two three four five six seven eight nine ten eleven") == "a"
    assert index.add("c", "completely different words about another subject entirely here") is None


def test_splits_are_disjoint_and_reproducible_for_a_seed() -> None:
    items, _, _ = make_items([exchange(explain(t), JANUARY, i) for i, t in enumerate(TOPICS)], "2026-01")
    first = split_items(items, seed=3, test_fraction=0.3)
    again = split_items(list(reversed(items)), seed=3, test_fraction=0.3)
    assert [(i.id, i.split) for i in first] == [(i.id, i.split) for i in again]
    test = {i.id for i in first if i.split == "test"}
    dev = {i.id for i in first if i.split == "dev"}
    assert len(test) == 3 and len(dev) == 7 and not test & dev and test | dev == {i.id for i in items}
    other_seeds = [
        {i.id for i in split_items(items, seed=s, test_fraction=0.3) if i.split == "test"} for s in range(5)
    ]
    assert any(chosen != test for chosen in other_seeds)
    (only,) = split_items(items[:1], seed=0, test_fraction=0.5)
    assert only.split in ("dev", "test")
    assert {i.split for i in split_items(items[:2], seed=0, test_fraction=0.1)} == {"dev", "test"}
    with pytest.raises(EvalSetError):
        split_items(items, seed=0, test_fraction=1.5)


def test_signals_come_from_the_exchange() -> None:
    assert detect_signal(exchange("x", JANUARY, response_format={"type": "json_object"})) == "json"
    assert (
        detect_signal(exchange("x", JANUARY, response_format={"type": "json_schema", "json_schema": {}}))
        == "json"
    )
    call = [{"id": "c", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}]
    assert detect_signal(exchange("x", JANUARY, tools=TOOLS, tool_calls=call)) == "tool_call"
    assert detect_signal(exchange("x", JANUARY, tools=TOOLS)) is None  # offered tools, answered in text
    assert detect_signal(exchange("x", JANUARY)) is None
    assert "tools: lookup_order" in prompt_text([{"role": "user", "content": "Hi"}], TOOLS)


@pytest.mark.parametrize(
    ("period", "since", "until"),
    [
        ("2026", datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026-q4", datetime(2026, 10, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026-q2", datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 7, 1, tzinfo=UTC)),
        ("2026-12", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026-w01", datetime(2025, 12, 29, tzinfo=UTC), datetime(2026, 1, 5, tzinfo=UTC)),
        ("2026-02-28", datetime(2026, 2, 28, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
    ],
)
def test_period_labels_name_windows(period: str, since: datetime, until: datetime) -> None:
    assert period_window(period) == (since, until)


def test_period_labels_without_a_window() -> None:
    assert period_window("spring-sale") is None
    with pytest.raises(BadPeriod):
        period_window("2026-13")


# -- building, rotation, listing -----------------------------------------------------------------------
def test_build_publishes_an_evalset_with_items_and_lineage(places: tuple[str, str]) -> None:
    database, registry = places
    json_request = {"response_format": {"type": "json_object"}}
    records = [exchange(explain(t), JANUARY, i) for i, t in enumerate(TOPICS[:6])]
    records += [exchange(explain(TOPICS[0]), JANUARY, 50)]  # a duplicate
    records += [exchange("Return the order as JSON with fields id and total.", JANUARY, 60, **json_request)]
    records += [
        exchange("An old prompt from December.", JANUARY - timedelta(days=40), 0)
    ]  # outside the window
    store(database, records)
    built = build_set("shop", "2026-01", database_url=database, registry=registry, seed=1)
    assert built.ref == "traffic-shop@2026-01" and built.records == 8 and built.duplicates == 1
    assert built.dev + built.test == 7 and built.retired == []
    manifest, items = load_set(built.ref, registry)
    assert manifest.kind == "evalset" and manifest.lineage.produced_by == "tandem traffic build-set"
    assert manifest.metadata["counts"]["records"] == 8 and manifest.metadata["signals"] == {
        "none": 6,
        "json": 1,
    }
    assert manifest.metadata["window"]["since"].startswith("2026-01-01")
    assert {i.period for i in items} == {"2026-01"} and len(items) == 7
    (json_item,) = [i for i in items if i.signal == "json"]
    assert json_item.response_format == {"type": "json_object"}
    # Built again from the same records and seed, the split is the same (in a fresh registry).
    again = build_set("shop", "2026-01", database_url=database, registry=registry + "-2", seed=1)
    assert [(i.id, i.split) for i in load_set(again.ref, registry + "-2")[1]] == [
        (i.id, i.split) for i in items
    ]


def test_rotation_leaves_out_earlier_periods_prompts_and_retires_them(places: tuple[str, str]) -> None:
    database, registry = places
    january = [exchange(explain(t), JANUARY, i) for i, t in enumerate(TOPICS[:5])]
    february = [
        exchange(explain(TOPICS[0]), FEBRUARY, 0),  # asked again in February: retired
        exchange(
            explain(TOPICS[1]).replace("curious", "bored"), FEBRUARY, 1
        ),  # a near-duplicate: retired too
        *(exchange(explain(t), FEBRUARY, 10 + i) for i, t in enumerate(TOPICS[5:])),
    ]
    store(database, january + february)
    first = build_set("faq", "2026-01", database_url=database, registry=registry)
    second = build_set("faq", "2026-02", database_url=database, registry=registry)
    assert second.retired_overlap == 2 and second.retired == ["traffic-faq@2026-01"]
    old_items, new_items = load_set(first.ref, registry)[1], load_set(second.ref, registry)[1]
    assert len(new_items) == len(TOPICS) - 5
    old_text = {json.dumps(i.messages) for i in old_items}
    assert not old_text & {json.dumps(i.messages) for i in new_items}
    manifest = open_registry(registry).manifest(second.ref)
    assert manifest.metadata["retired"] == ["traffic-faq@2026-01"] and manifest.lineage.parents == [first.ref]
    listed = list_sets(registry)
    assert [(v.period, v.current) for v in listed] == [("2026-01", False), ("2026-02", True)]
    assert [v.period for v in list_sets(registry, "faq")] == ["2026-01", "2026-02"]
    # A later period whose traffic only repeats earlier prompts has nothing new.
    store(database, [exchange(explain(TOPICS[2]), datetime(2026, 3, 5, tzinfo=UTC), 0)])
    with pytest.raises(NoRecordsInWindow, match="repeat prompts of earlier periods"):
        build_set("faq", "2026-03", database_url=database, registry=registry)


def test_bad_input_gets_clear_errors(places: tuple[str, str]) -> None:
    database, registry = places
    store(database, [exchange(explain(TOPICS[0]), JANUARY, 0)])
    with pytest.raises(NoRecordsInWindow, match="no captured records"):
        build_set("faq", "2025-06", database_url=database, registry=registry)
    with pytest.raises(BadPeriod, match="invalid period"):
        build_set("faq", "Jan 2026", database_url=database, registry=registry)
    with pytest.raises(BadPeriod, match="names no window"):
        build_set("faq", "spring-sale", database_url=database, registry=registry)
    with pytest.raises(BadPeriod, match="empty"):
        build_set(
            "faq", "spring-sale", database_url=database, registry=registry, since=FEBRUARY, until=JANUARY
        )
    with pytest.raises(EvalSetError, match="invalid set name"):
        build_set("FAQ!", "2026-01", database_url=database, registry=registry)
    built = build_set(
        "faq", "spring-sale", database_url=database, registry=registry, since=datetime(2026, 1, 1)
    )
    assert built.ref == "traffic-faq@spring-sale"
    with pytest.raises(BadPeriod, match="already published"):
        build_set("faq", "spring-sale", database_url=database, registry=registry, since=datetime(2026, 1, 1))
    with pytest.raises(UnknownSet, match="traffic-nope"):
        list_sets(registry, "nope")


def test_cli_build_and_list(places: tuple[str, str]) -> None:
    database, registry = places
    store(database, [exchange(explain(t), JANUARY, i) for i, t in enumerate(TOPICS[:4])])
    runner = CliRunner()
    result = runner.invoke(traffic_app, ["build-set", "--name", "cli", "--period", "2026-01", "--database", database,
                                         "--registry", registry, "--test-fraction", "0.5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "traffic-cli@2026-01" in result.output and "2 dev + 2 test" in result.output
    listed = runner.invoke(traffic_app, ["list", "--registry", registry], terminal_width=200)
    assert listed.exit_code == 0 and "traffic-cli" in listed.output and "current" in listed.output
    missing = runner.invoke(traffic_app, ["build-set", "--name", "cli", "--period", "2025-01", "--database", database,
                                          "--registry", registry])  # fmt: skip
    assert isinstance(missing.exception, NoRecordsInWindow)


def test_items_round_trip_through_the_published_file(places: tuple[str, str]) -> None:
    database, registry = places
    call = [{"id": "c", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}]
    store(
        database,
        [exchange("Where is order <ID>?", JANUARY, 0, tools=TOOLS, tool_calls=call, tool_choice="auto")],
    )
    built = build_set("tools", "2026-01", database_url=database, registry=registry, test_fraction=1.0)
    (item,) = load_set(built.ref, registry)[1]
    assert isinstance(item, EvalSetItem)
    assert (item.signal, item.tools, item.tool_choice, item.split) == ("tool_call", TOOLS, "auto", "test")
