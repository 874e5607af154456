"""Single-turn rollout formats per task family: what the policy sees, what a demonstration looks like,
and how a completion becomes the verifier's input.

The policy only ever sees ``messages(instance)`` (the instance prompt plus a system instruction); the
expected answer, checks and hidden files stay on the reward side. A family whose eval registration declares
a reference answer (its verifier takes the completion text, as documents' does) is trained single-turn with
no code here: :class:`SingleTurnFormat` uses its own system prompt, reference answers and verifier. A family
that trains on another protocol registers a format with :func:`rollout_format` (terminal: one script).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from evalsuite.errors import GeneratorError
from evalsuite.registry import EvalFamily, families, get_family
from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.errors import UnsupportedFamily

Message = dict[str, str]

# Single-turn terminal rollouts answer with a whole script; the Inspect terminal task is multi-turn with a
# bash tool (evalsuite.families.terminal.prompt.TERMINAL_SYSTEM), so this family trains on a different protocol than it is
# evaluated with.
TERMINAL_SCRIPT_SYSTEM = (
    "You are working in a Linux shell in the task's working directory; there is no network. Reply with "
    "one bash script in a ```bash code block that completes the task, and nothing else."
)
# Wall-clock bound on a rollout's script; a limit it runs into (this one included) scores the rollout 0.
SOLUTION_TIMEOUT_S = 20
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


class SingleTurnFormat:
    """A text-answer family rolled out as its eval registration says: its system prompt, its reference
    answers as demonstrations, its verifier on the completion text. Protocol compliance is the verifier's
    ``format`` component where it reports one (nothing to comply with otherwise)."""

    def __init__(self, family: EvalFamily) -> None:
        if family.reference_answer is None:
            raise UnsupportedFamily(f"family {family.name!r} declares no reference answer")
        self.family = family.name
        self._eval_family = family
        self._reference_answer = family.reference_answer

    def messages(self, instance: TaskInstance) -> list[Message]:
        system = self._eval_family.system_prompt
        prompt = {"role": "user", "content": instance.prompt}
        return [{"role": "system", "content": system}, prompt] if system else [prompt]

    def demonstration(self, instance: TaskInstance) -> str:
        return self._reference_answer(instance)

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        result = self._eval_family.verify(instance, completion)
        return result, result.components.get("format", 1.0)


def supported_families() -> list[str]:
    """Families post-training can roll out: a registered format, or a text-answer eval family."""
    single_turn = {f.name for f in families() if f.reference_answer is not None}
    return sorted(set(_FORMATS) | single_turn)


def format_for(family: str) -> RolloutFormat:
    """The format of ``family``; raises :class:`UnsupportedFamily` with the supported ones."""
    if family in _FORMATS:
        return _FORMATS[family]
    try:
        registered = get_family(family)
    except GeneratorError:
        registered = None
    if registered is None or registered.reference_answer is None:
        raise UnsupportedFamily(
            f"family {family!r} has no single-turn rollout format in posttrain "
            f"(supported: {', '.join(supported_families())}); families with an episode environment (agent, "
            "terminal) train as multi-turn tool episodes instead (pool.rollout: episode)"
        )
    return SingleTurnFormat(registered)


def extract_script(completion: str) -> str | None:
    """The last fenced bash block of a completion, or None when there is none."""
    blocks = _BASH_BLOCK.findall(completion or "")
    return blocks[-1].strip() if blocks else None


def limit_verdict(limits: Sequence[str]) -> VerifierResult:
    """The verdict of a rollout whose commands ran into sandbox limits: zero, with each limit a component
    (``memory_limit``, ``process_limit``, ``timeout``, ``output_limit``) so the trace says why."""
    return VerifierResult(
        score=0.0,
        correct=False,
        components={limit: 1.0 for limit in limits},
        explanation="sandbox limit hit: " + ", ".join(limits),
    )


async def _run_terminal(instance: TaskInstance, script: str) -> tuple[VerifierResult, float]:
    from evalsuite.families.terminal.verifier import verify_terminal_in_sandbox
    from evalsuite.sandbox import bwrap_sandbox

    async with bwrap_sandbox() as sandbox:
        for path, contents in instance.files.items():
            await sandbox.write_file(path, contents)
        await sandbox.write_file("solution.sh", script)
        try:
            await sandbox.exec(["bash", "solution.sh"], timeout=SOLUTION_TIMEOUT_S)
        except TimeoutError:
            pass
        if sandbox.limits_hit:
            return limit_verdict(sandbox.limits_hit), 0.0
        await sandbox.exec(["rm", "-f", "solution.sh"], timeout=10)
        result = await verify_terminal_in_sandbox(instance, sandbox)
        # The checks run the model's code too (hidden tests import its module): a limit hit there voids it.
        if sandbox.limits_hit:
            return limit_verdict(sandbox.limits_hit), 0.0
        return result, 1.0


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
        return asyncio.run(_run_terminal(instance, script))


def messages_json(instance: TaskInstance) -> str:
    """The policy-visible prompt of an instance as JSON (for traces)."""
    return json.dumps(format_for(instance.family).messages(instance))
