"""Long-context tasks: one needle (a number, a name or a table cell) hidden at a depth of a long haystack.

The task type is the needle kind; the difficulty picks the target length (hard: the longest, up to the
served window, see :class:`LongContextConfig`). Each instance's metadata carries ``length`` (target tokens),
``depth`` and ``needle`` so results can be grouped into a recall heatmap (``report.py``).
"""

from __future__ import annotations

import random
from typing import Any

from evalsuite.families.long_context.haystack import Haystack, build_haystack, current_config
from evalsuite.families.long_context.prompt import LONG_CONTEXT_SYSTEM, frame
from evalsuite.generators.base import CITIES, FIRST_NAMES, LAST_NAMES, WORDS, Builder, Draft
from evalsuite.schema import Difficulty, TaskInstance

_PLACES = ("vault", "locker", "strongroom", "archive room", "cellar door", "signal box")
_ROLES = (
    ("keeper", "the {direction} lighthouse"),
    ("head gardener", "the {word} estate"),
    ("captain", "the ferry {Word}"),
    ("archivist", "the {city} library"),
    ("bell ringer", "the {word} chapel"),
)
_DIRECTIONS = ("north", "south", "east", "west", "upper", "lower")
_ITEMS = ("rope", "lamp oil", "canvas", "tar", "nails", "flour", "salt", "timber", "wool", "candles")


def _haystack(
    rng: random.Random, difficulty: Difficulty, needle: str, question: str
) -> tuple[Haystack, int, float]:
    config = current_config()
    target = rng.choice(config.lengths_for(difficulty))
    depth = rng.choice(config.depths)
    built = build_haystack(rng, target, depth, needle, lambda hay: frame(hay, question), LONG_CONTEXT_SYSTEM,
                           config)  # fmt: skip
    return built, target, depth


def _draft(
    kind: str,
    rng: random.Random,
    difficulty: Difficulty,
    needle: str,
    question: str,
    expected: dict[str, Any],
) -> Draft:
    built, target, depth = _haystack(rng, difficulty, needle, question)
    config = current_config()
    return Draft(
        task_type=kind,
        prompt=built.prompt,
        expected=expected,
        metadata={
            "length": target,
            "depth": depth,
            "needle": kind,
            "needle_text": needle,
            "prompt_tokens": built.tokens,
            "max_length": config.max_length,
        },
    )


def number(rng: random.Random, difficulty: Difficulty) -> Draft:
    place, index, code = rng.choice(_PLACES), rng.randrange(2, 60), rng.randrange(10000, 100000)
    needle = f"The access code for {place} {index} is {code}."
    question = f"What is the access code for {place} {index}?"
    return _draft("number", rng, difficulty, needle, question, {"answer": code, "match": "numeric"})


def name(rng: random.Random, difficulty: Difficulty) -> Draft:
    role, template = rng.choice(_ROLES)
    word = rng.choice(WORDS)
    where = template.format(
        direction=rng.choice(_DIRECTIONS), word=word, Word=word.title(), city=rng.choice(CITIES)
    )
    person = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    needle = f"The {role} of {where} is {person}."
    question = f"Who is the {role} of {where}?"
    return _draft("name", rng, difficulty, needle, question, {"answer": person, "match": "name"})


_COLUMNS = ("Depot", "Item", "Units", "Inspector")


def table(rng: random.Random, difficulty: Difficulty) -> Draft:
    depots = rng.sample(CITIES, rng.randrange(4, 7))
    rows = [
        [depot, rng.choice(_ITEMS), str(rng.randrange(12, 990)), rng.choice(LAST_NAMES)] for depot in depots
    ]
    week = rng.randrange(1, 53)
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    needle = f"Depot inventory, week {week}:\n\n" + "\n".join(lines)
    row = rng.choice(rows)
    column = rng.choice((1, 2, 3))
    question = {
        1: f"In the depot inventory table for week {week}, which item is stored at the {row[0]} depot?",
        2: f"In the depot inventory table for week {week}, how many units are held at the {row[0]} depot?",
        3: f"In the depot inventory table for week {week}, who is the inspector of the {row[0]} depot?",
    }[column]
    return _draft("table", rng, difficulty, needle, question,
                  {"answer": row[column], "match": "exact", "column": _COLUMNS[column]})  # fmt: skip


BUILDERS: dict[str, Builder] = {"number": number, "name": name, "table": table}


def reference_answer(instance: TaskInstance) -> str:
    """The right completion for an instance: its expected value on an ``ANSWER:`` line."""
    return f"ANSWER: {instance.expected['answer']}"
