"""The stage checkpoint that lets a long benchmark resume where it stopped."""

from __future__ import annotations

from pathlib import Path

from bench.recording import StageCheckpoint


def test_a_rerun_of_the_same_configuration_reuses_finished_stages(tmp_path: Path) -> None:
    calls: list[str] = []

    def work(name: str) -> dict[str, int]:
        calls.append(name)
        return {"tokens": len(calls)}

    first = StageCheckpoint(tmp_path, "fast", {"k": [3, 4], "draft": "r6"})
    assert first.run("standard", lambda: work("standard")) == {"tokens": 1}
    # The process dies here; the rerun of the same configuration measures only what is missing.
    again = StageCheckpoint(tmp_path, "fast", {"draft": "r6", "k": [3, 4]})
    assert again.path == first.path
    assert again.run("standard", lambda: work("standard again")) == {"tokens": 1}
    assert again.run("turn group 1", lambda: work("turn group 1")) == {"tokens": 2}
    assert calls == ["standard", "turn group 1"]

    other = StageCheckpoint(tmp_path, "fast", {"k": [3, 4], "draft": "r7"})
    assert other.path != first.path
    assert other.run("standard", lambda: work("standard r7")) == {"tokens": 3}

    again.finish()
    assert not again.path.exists()
    assert StageCheckpoint(tmp_path, "fast", {"k": [3, 4], "draft": "r6"}).stages == {}
