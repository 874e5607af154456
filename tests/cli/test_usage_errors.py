"""A mistyped command line gets click's usage message and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["registry"], "No such command 'registry'"),
        (["posttrain", "rl", "--bogus"], "No such option: --bogus"),
        (["eval", "--limit", "many"], "Invalid value for '--limit'"),
    ],
)
def test_a_usage_error_is_one_message_and_exit_2(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
