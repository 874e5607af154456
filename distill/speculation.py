"""Choosing ``num_speculative_tokens`` from acceptance ``a`` and draft cost ``c`` (fraction of a target step)."""

from __future__ import annotations

from pydantic import BaseModel, Field


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """Tokens emitted per verification step with ``k`` draft tokens: ``(1 - a^(k+1)) / (1 - a)``."""
    if k < 0:
        raise ValueError("k must be >= 0")
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def expected_speedup(acceptance: float, cost_ratio: float, k: int) -> float:
    """Speedup over plain decoding: expected tokens per step over the step's cost ``k*c + 1``."""
    return expected_tokens_per_step(acceptance, k) / (k * cost_ratio + 1.0)


class SpeculationChoice(BaseModel):
    """The chosen ``num_speculative_tokens`` and the numbers it was chosen from."""

    num_speculative_tokens: int
    acceptance: float
    cost_ratio: float
    expected_speedup: float
    worthwhile: bool = Field(description="False when even the best k is expected to be slower than no draft.")
    speedup_by_k: dict[int, float] = Field(default_factory=dict)


def choose_num_speculative_tokens(acceptance: float, cost_ratio: float, max_k: int = 8) -> SpeculationChoice:
    """The ``k`` in ``1..max_k`` that maximises :func:`expected_speedup` (ties go to the smaller k)."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if cost_ratio < 0.0:
        raise ValueError(f"cost ratio must be >= 0, got {cost_ratio}")
    table = {k: expected_speedup(acceptance, cost_ratio, k) for k in range(1, max_k + 1)}
    best = max(table, key=lambda k: (round(table[k], 9), -k))
    return SpeculationChoice(
        num_speculative_tokens=best,
        acceptance=acceptance,
        cost_ratio=cost_ratio,
        expected_speedup=table[best],
        worthwhile=table[best] > 1.0,
        speedup_by_k={k: round(v, 4) for k, v in table.items()},
    )
