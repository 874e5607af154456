"""Reading the eval gate's verdict before a rollout's first step.

``tandem gate`` writes its :class:`~evalsuite.gate.GateVerdict` as ``verdict.json`` beside its reports;
that model is what is read. Reports without one (another gate, an older run) are read as before: JSON at
a dotted field, Markdown on its ``# Release gate: PASS|FAIL`` heading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalsuite.gate import GateVerdict
from evalsuite.gate_report import VERDICT_FILE
from infra.errors import RolloutError
from infra.registry import Registry, registry_step
from release.rollout import GateRequirement

_MARKDOWN_VERDICT = re.compile(r"^#\s*Release gate:\s*(PASS|FAIL)\b", re.IGNORECASE | re.MULTILINE)


def _verdict_text(value: Any) -> str:
    if isinstance(value, bool):
        return "pass" if value else "fail"
    if isinstance(value, str):
        return value.strip().lower()
    raise RolloutError(f"gate verdict must be a boolean or a string, got {value!r}")


def parse_gate_report(text: str, source: str, verdict_field: str) -> str:
    """The verdict ("pass", "fail", ...) of a gate report's text: JSON at ``verdict_field``, or Markdown."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            node: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RolloutError(f"{source}: gate report is not valid JSON: {exc}") from exc
        for part in verdict_field.split("."):
            if not isinstance(node, dict) or part not in node:
                raise RolloutError(f"{source}: gate report has no field {verdict_field!r}")
            node = node[part]
        return _verdict_text(node)
    match = _MARKDOWN_VERDICT.search(text)
    if match is None:
        raise RolloutError(f"{source}: no '# Release gate: PASS|FAIL' heading and not a JSON report")
    return match.group(1).lower()


def _verdict_beside(report: Path) -> Path | None:
    """The gate's typed verdict for a report: the file itself if JSON, else ``verdict.json`` beside it."""
    if report.is_dir():
        found = report / VERDICT_FILE
    elif report.suffix == ".json":
        found = report
    else:
        found = report.with_name(VERDICT_FILE)
    return found if found.is_file() else None


def load_gate_verdict(path: Path) -> GateVerdict | None:
    """The :class:`GateVerdict` ``tandem gate`` wrote for ``path``; None when there is none (another format)."""
    found = _verdict_beside(path)
    if found is None:
        return None
    try:
        return GateVerdict.model_validate_json(found.read_text())
    except OSError as exc:
        raise RolloutError(f"gate verdict {found}: cannot read: {exc.strerror}") from exc
    except ValidationError:
        return None  # a JSON report of another shape: read at verdict_field


def _read_report(report: Path, name: Callable[[Path], str], verdict_field: str) -> tuple[str, str]:
    """``(verdict, source)`` of one report path; ``name`` turns the file read into its source text."""
    verdict = load_gate_verdict(report)
    if verdict is not None:
        typed = _verdict_beside(report)
        assert typed is not None
        return ("pass" if verdict.passed else "fail"), name(typed)
    source = name(report)
    if report.is_dir():
        raise RolloutError(f"gate report {source}: the directory has no {VERDICT_FILE}")
    try:
        text = report.read_text()
    except OSError as exc:
        raise RolloutError(f"gate report {source}: cannot read: {exc.strerror}") from exc
    return parse_gate_report(text, source, verdict_field), source


def read_gate_verdict(gate: GateRequirement, registry: Registry | None) -> tuple[str, str]:
    """``(verdict, source)`` of the configured gate report, fetched and verified from the registry if a ref."""
    if gate.path is not None:
        local = gate.path
        return _read_report(local, lambda read: str(local if read == local else read), gate.verdict_field)
    assert gate.ref is not None
    if registry is None:
        raise RolloutError(f"gate report {gate.ref} is a registry ref but no registry was given")
    with registry_step(f"fetching the gate report {gate.ref}"):
        root = registry.fetch(gate.ref)
    report = root / gate.file
    if not report.is_file():
        raise RolloutError(f"gate report {gate.ref}:{gate.file}: the artifact has no file {gate.file!r}")
    return _read_report(report, lambda read: f"{gate.ref}:{read.relative_to(root)}", gate.verdict_field)
