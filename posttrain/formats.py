"""Single-turn rollout formats per task family: what the policy sees, what a demonstration looks like,
and how a completion becomes the verifier's input.

The policy only ever sees ``messages(instance)`` (the instance prompt plus a system instruction); the
expected answer, checks and hidden files stay on the reward side. Formats register with
:func:`rollout_format`, so a new family plugs in without touching the trainers.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any, Protocol

from evalsuite.prompts import DOCUMENTS_SYSTEM
from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.errors import UnsupportedFamily

Message = dict[str, str]

# Single-turn terminal rollouts answer with a whole script; the Inspect terminal task is multi-turn with a
# bash tool (evalsuite.prompts.TERMINAL_SYSTEM), so this family trains on a different protocol than it is
# evaluated with.
TERMINAL_SCRIPT_SYSTEM = (
    "You are working in a Linux shell in the task's working directory; there is no network. Reply with "
    "one bash script in a ```bash code block that completes the task, and nothing else."
)
_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)```", re.DOTALL)


class RolloutFormat(Protocol):
    """How one family is rolled out in a single turn."""

    family: str

    def messages(self, instance: TaskInstance) -> list[Message]: ...

    def demonstration(self, instance: TaskInstance) -> str: ...

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        """The verifier's verdict and a protocol-compliance score in [0, 1]."""
        ...


_FORMATS: dict[str, RolloutFormat] = {}


def rollout_format(cls: Callable[[], RolloutFormat]) -> Callable[[], RolloutFormat]:
    """Class decorator: register a family's rollout format."""
    instance = cls()
    _FORMATS[instance.family] = instance
    return cls


def format_for(family: str) -> RolloutFormat:
    """The registered format of ``family``; raises :class:`UnsupportedFamily` with the allowed ones."""
    if family not in _FORMATS:
        raise UnsupportedFamily(
            f"family {family!r} has no single-turn rollout format in posttrain "
            f"(supported: {', '.join(sorted(_FORMATS))}); agent episodes need multi-turn tool rollouts"
        )
    return _FORMATS[family]


def _render_answer(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.2f}"
    return str(value)


@rollout_format
class DocumentsFormat:
    family = "documents"

    def messages(self, instance: TaskInstance) -> list[Message]:
        return [{"role": "system", "content": DOCUMENTS_SYSTEM}, {"role": "user", "content": instance.prompt}]

    def demonstration(self, instance: TaskInstance) -> str:
        return f"ANSWER: {_render_answer(instance.expected['answer'])}"

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        from evalsuite.verifiers import verify_documents

        result = verify_documents(instance, completion)
        return result, result.components.get("format", 0.0)


def extract_script(completion: str) -> str | None:
    """The last fenced bash block of a completion, or None when there is none."""
    blocks = _BASH_BLOCK.findall(completion or "")
    return blocks[-1].strip() if blocks else None


async def _run_terminal(instance: TaskInstance, script: str) -> VerifierResult:
    from evalsuite.sandbox import bwrap_sandbox
    from evalsuite.verifiers import verify_terminal_in_sandbox

    async with bwrap_sandbox() as sandbox:
        for path, contents in instance.files.items():
            await sandbox.write_file(path, contents)
        await sandbox.write_file("solution.sh", script)
        try:
            await sandbox.exec(["bash", "solution.sh"], timeout=20)
        except TimeoutError:
            pass
        await sandbox.exec(["rm", "-f", "solution.sh"], timeout=10)
        return await verify_terminal_in_sandbox(instance, sandbox)


@rollout_format
class TerminalFormat:
    family = "terminal"

    def messages(self, instance: TaskInstance) -> list[Message]:
        return [
            {"role": "system", "content": TERMINAL_SCRIPT_SYSTEM},
            {"role": "user", "content": instance.prompt},
        ]

    def demonstration(self, instance: TaskInstance) -> str:
        return f"```bash\n{instance.expected['reference_solution']}\n```"

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        script = extract_script(completion)
        if script is None:
            return VerifierResult(score=0.0, correct=False, explanation="no bash block"), 0.0
        return asyncio.run(_run_terminal(instance, script)), 1.0


def supported_families() -> list[str]:
    return sorted(_FORMATS)


def messages_json(instance: TaskInstance) -> str:
    """The policy-visible prompt of an instance as JSON (for traces)."""
    return json.dumps(format_for(instance.family).messages(instance))
