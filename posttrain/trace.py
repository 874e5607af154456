"""Full-chain rollout tracing: one JSONL record per rollout (prompt, sampling parameters, completion,
reward components, policy version), sealed with a sha256 sidecar that readers verify."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from posttrain.errors import TraceCorrupted

TRACE_NAME = "rollouts.jsonl"
SEAL_SUFFIX = ".sha256"


class RolloutRecord(BaseModel):
    """One rollout, or one run event (``kind='event'``: rollback, canary, tier change)."""

    kind: Literal["rollout", "event"] = "rollout"
    stage: str = Field(description="sft, rl or dpo.")
    policy_version: int = Field(description="Optimizer steps the policy had taken when it produced this.")
    instance_id: str = ""
    family: str = ""
    difficulty: str = ""
    group: int = Field(default=-1, description="Index of the prompt's group within its generation batch.")
    prompt: list[dict[str, str]] = Field(default_factory=list, description="Policy-visible messages.")
    sampling: dict[str, Any] = Field(default_factory=dict)
    completion: str = ""
    reward: float = 0.0
    components: dict[str, float] = Field(default_factory=dict)
    correct: bool = False
    explanation: str = ""
    event: dict[str, Any] = Field(default_factory=dict)
    time: float = Field(default_factory=time.time)


class TraceWriter:
    """Appends records to ``<dir>/rollouts.jsonl``; :meth:`seal` writes the digest readers check."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / TRACE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.count = sum(1 for _ in self.path.open()) if self.path.exists() else 0

    def write(self, record: RolloutRecord) -> None:
        with self.path.open("a") as handle:
            handle.write(record.model_dump_json() + "\n")
        self.count += 1

    def truncate(self, count: int) -> None:
        """Keep the first ``count`` records (a resumed run redoes the steps after its checkpoint)."""
        if self.count <= count:
            return
        with self.path.open() as handle:
            kept = [line for _, line in zip(range(count), handle, strict=False)]
        self.path.write_text("".join(kept))
        self.count = count

    def event(self, stage: str, policy_version: int, **event: Any) -> None:
        self.write(RolloutRecord(kind="event", stage=stage, policy_version=policy_version, event=event))

    def seal(self) -> str:
        """Write ``rollouts.jsonl.sha256`` (digest and record count) and return the digest."""
        self.path.touch()
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        Path(str(self.path) + SEAL_SUFFIX).write_text(json.dumps({"sha256": digest, "records": self.count}))
        return digest


def read_trace(path: Path) -> list[RolloutRecord]:
    """Every record of a sealed trace; raises :class:`TraceCorrupted` naming the file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / TRACE_NAME
    seal_path = Path(str(path) + SEAL_SUFFIX)
    if not path.is_file() or not seal_path.is_file():
        raise TraceCorrupted(f"trace {path}: missing {'trace' if not path.is_file() else 'seal'} file")
    data = path.read_bytes()
    try:
        seal = json.loads(seal_path.read_text())
        expected, records = str(seal["sha256"]), int(seal["records"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TraceCorrupted(f"trace {path}: unreadable seal {seal_path.name} ({exc})") from exc
    if hashlib.sha256(data).hexdigest() != expected:
        raise TraceCorrupted(f"trace {path}: sha256 does not match its seal (modified or truncated)")
    parsed = []
    for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
        try:
            parsed.append(RolloutRecord.model_validate_json(line))
        except ValidationError as exc:
            raise TraceCorrupted(f"trace {path}: line {number} is not a valid rollout record") from exc
    if len(parsed) != records:
        raise TraceCorrupted(f"trace {path}: {len(parsed)} records, seal says {records}")
    return parsed
