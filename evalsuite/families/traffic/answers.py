"""Reading the traffic family's answers back from the Inspect logs ``tandem eval`` wrote (for review pairs)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evalsuite.errors import EvalError
from evalsuite.families.traffic.items import EvalSetItem, Signal

ITEM_KEY, SET_KEY, NEEDS_REVIEW = "traffic_item", "set_ref", "needs_review"


class TrafficAnswer(BaseModel):
    """One model's answer to one eval-set item, as logged."""

    item_id: str
    set_ref: str = Field(description="The eval set replayed (traffic-NAME@PERIOD).")
    model: str = Field(description="The Inspect model name that answered.")
    split: str
    period: str
    messages: list[dict[str, Any]] = Field(description="The prompt (OpenAI shape, de-identified).")
    tools: list[dict[str, Any]] | None = None
    answer: str = Field(description="The answer's text ('' when it only called tools).")
    tool_calls: list[dict[str, Any]] | None = Field(
        None, description="The answer's tool calls, OpenAI shape (arguments as JSON text)."
    )
    signal: Signal | None
    auto_score: float | None = Field(description="The automatic 0-1 score; None when it needs review.")
    needs_review: bool
    error: str | None = Field(
        None, description="Why the sample failed, when it did (then the answer is empty)."
    )


def _tool_calls(message: Any) -> list[dict[str, Any]] | None:
    calls = getattr(message, "tool_calls", None) or []
    converted = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
    return converted or None


def read_answers(log_dir: Path) -> dict[str, TrafficAnswer]:
    """Every traffic-family answer in the Inspect logs under ``log_dir``, by item id.

    When several logs hold the same item (a rerun), the newest log's answer wins; of several epochs, the
    first. Samples of other families are skipped. EvalError when ``log_dir`` holds no traffic answers.
    """
    from inspect_ai.log import list_eval_logs, read_eval_log

    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        raise EvalError(f"{log_dir}: no such log directory")
    logs = []
    for info in list_eval_logs(str(log_dir)):
        eval_log = read_eval_log(info.name)
        # Oldest first, so a rerun's answers overwrite; the times have one-second resolution, the file's
        # modification time breaks ties.
        logs.append(((eval_log.eval.created, eval_log.stats.completed_at or "", info.mtime or 0.0), eval_log))
    answers: dict[str, TrafficAnswer] = {}
    for _, eval_log in sorted(logs, key=lambda entry: entry[0]):
        model = str(eval_log.eval.model)
        seen: set[str] = set()
        for sample in sorted(eval_log.samples or [], key=lambda s: s.epoch):
            metadata = sample.metadata or {}
            if ITEM_KEY not in metadata or str(sample.id) in seen:
                continue
            seen.add(str(sample.id))
            item = EvalSetItem.model_validate(metadata[ITEM_KEY])
            output = sample.output
            message = output.message if output is not None and output.choices else None
            score = next(iter(sample.scores.values())) if sample.scores else None
            value = score.value if score is not None else None
            auto = (
                float(value)
                if item.signal is not None and isinstance(value, int | float) and not math.isnan(value)
                else (0.0 if item.signal is not None and sample.error is not None else None)
            )
            answers[str(sample.id)] = TrafficAnswer(
                item_id=str(sample.id),
                set_ref=str(metadata.get(SET_KEY, "")),
                model=model,
                split=item.split,
                period=item.period,
                messages=item.messages,
                tools=item.tools,
                answer=output.completion if output is not None else "",
                tool_calls=_tool_calls(message),
                signal=item.signal,
                auto_score=auto,
                needs_review=item.signal is None,
                error=sample.error.message if sample.error is not None else None,
            )
    if not answers:
        raise EvalError(
            f"{log_dir}: no traffic-family answers in its Inspect logs (run `tandem eval --families traffic`)"
        )
    return answers
