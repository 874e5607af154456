from __future__ import annotations

import pytest

from distill.cli import _parse_keep
from distill.draft_init import spread_layers
from distill.errors import DistillError
from infra.errors import ConfigError


def test_spread_layers_keeps_first_and_last() -> None:
    assert spread_layers(30, 4) == [0, 10, 19, 29]
    assert spread_layers(30, 2) == [0, 29]
    assert spread_layers(30, 1) == [0]
    assert spread_layers(4, 4) == [0, 1, 2, 3]


def test_spread_layers_rejects_impossible_depths() -> None:
    with pytest.raises(DistillError):
        spread_layers(30, 31)
    with pytest.raises(DistillError):
        spread_layers(30, 0)


def test_keep_flag_parsing() -> None:
    assert _parse_keep("0,10,20,29") == [0, 10, 20, 29]
    assert _parse_keep(None) is None
    with pytest.raises(ConfigError):
        _parse_keep("0,ten")
