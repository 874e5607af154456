from __future__ import annotations

import math

import pytest

from distill.speculation import choose_num_speculative_tokens, expected_speedup, expected_tokens_per_step


def test_expected_tokens_per_step_matches_geometric_sum() -> None:
    a = 0.8
    for k in range(0, 6):
        assert math.isclose(expected_tokens_per_step(a, k), sum(a**i for i in range(k + 1)))
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.0, 4) == 1.0


def test_speedup_divides_by_step_cost() -> None:
    assert math.isclose(expected_speedup(0.75, 0.25, 3), (1 - 0.75**4) / 0.25 / 1.75)


@pytest.mark.parametrize(
    ("acceptance", "cost", "expected_k"),
    [
        (0.9, 0.05, 8),  # cheap, accurate draft: speculate as far as allowed
        (0.75, 0.25, 3),  # 1.5625 at k=3 vs 1.5417 at k=2 and 1.5254 at k=4
        (0.3, 0.5, 1),  # weak draft: one token at most
    ],
)
def test_choice_maximises_expected_speedup(acceptance: float, cost: float, expected_k: int) -> None:
    choice = choose_num_speculative_tokens(acceptance, cost, max_k=8)
    best = max(range(1, 9), key=lambda k: expected_speedup(acceptance, cost, k))
    assert choice.num_speculative_tokens == best
    assert choice.expected_speedup == pytest.approx(expected_speedup(acceptance, cost, best))
    assert choice.worthwhile == (choice.expected_speedup > 1.0)


def test_choice_rejects_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        choose_num_speculative_tokens(1.5, 0.2)
    with pytest.raises(ValueError):
        choose_num_speculative_tokens(0.5, -0.1)
