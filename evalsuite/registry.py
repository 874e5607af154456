"""The registry of eval families (Inspect style): a family registers itself with :func:`eval_family`.

A family is one folder under ``evalsuite/families/`` (generator, verifier, task, prompt) whose
``__init__`` decorates its verifier; every folder there is found by scanning the package. A third-party
package adds a family the way Inspect finds extensions: an entry point in the ``tandem.families`` group
naming a module whose import registers it::

    [project.entry-points."tandem.families"]
    riddles = "mypackage.riddles"

Everything that needs the list of families (schema validation, generators, ``verify``, the Inspect tasks,
``tandem eval``, the gate, post-training's pool) asks this module, so a new family is never an edit there.
Discovery is lazy and imports no Inspect: a family's Inspect task is named as ``"module:function"`` and
imported only when a run needs it.

A *replay* family (:func:`replay_family`, e.g. ``traffic``) replays a published eval set instead of generating
instances. It runs only when named (``tandem eval --families traffic --traffic-set REF``) with its options;
it is not one of :func:`family_names` (the generated suite that the gate, post-training and a default
``tandem eval`` use).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from evalsuite.errors import GeneratorError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tandem.families"
# The registry sits below evalsuite.schema (which validates family names against it), so it holds the
# families' callables without naming schema's types: (TaskInstance, state) -> VerifierResult, and
# (random.Random, Difficulty) -> Draft for a builder; each family's own module types them fully.
Verifier = Callable[[Any, Any], Any]
Builder = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class EvalFamily:
    """One registered family: how its instances are made, scored and run as an Inspect task."""

    name: str
    builders: dict[str, Builder] = field(repr=False)
    """Task type -> seeded builder (the family's generator)."""
    verify: Verifier = field(repr=False)
    """Scores one output for one instance; raises :class:`EvalError` for an output of the wrong kind."""
    task: str
    """``"module:function"`` of the family's Inspect ``@task`` (imported only when a run needs it)."""
    system_prompt: str | None = field(default=None, repr=False)
    """The instruction the model is judged with; post-training trains with the same one."""
    reference_answer: Callable[[Any], str] | None = field(default=None, repr=False)
    """A completion text the verifier scores correct. Set only by families whose verifier takes the
    completion text: post-training trains those single-turn on the system prompt and these answers."""
    report: str | None = None
    """``"module:function"`` of an optional report writer, ``(samples, out_dir, model) -> list[Path]``, that
    ``tandem eval`` calls with the family's scored Inspect samples after a run (plots beside the logs)."""

    def task_types(self) -> list[str]:
        """The task types the family generates, in a stable order."""
        return sorted(self.builders)

    def load_task(self) -> Callable[..., Any]:
        """The family's Inspect task function (imports Inspect)."""
        module, _, function = self.task.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]

    def load_report(self) -> Callable[..., Any] | None:
        """The family's report writer, or None when it has none."""
        if self.report is None:
            return None
        module, _, function = self.report.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class ReplayFamily:
    """A registered replay family: an Inspect task over a published eval set, with named options."""

    name: str
    task: str
    """``"module:function"`` of its Inspect ``@task``, called with ``split``, ``n``, ``seed`` and the options."""
    options: dict[str, str] = field(default_factory=dict)
    """Option name -> help; ``tandem eval`` passes them as ``--family-option NAME.OPTION=VALUE``."""
    required: tuple[str, ...] = ()
    """Options a run must give."""

    def load_task(self) -> Callable[..., Any]:
        """The family's Inspect task function (imports Inspect)."""
        module, _, function = self.task.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]

    def check_options(self, options: dict[str, Any]) -> None:
        """GeneratorError naming the option when one is unknown or a required one is missing."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise GeneratorError(
                f"family {self.name!r} has no option {unknown[0]!r} (options: {', '.join(sorted(self.options))})"
            )
        missing = [name for name in self.required if options.get(name) in (None, "")]
        if missing:
            raise GeneratorError(
                f"family {self.name!r} needs the option {missing[0]!r}: {self.options[missing[0]]}"
            )


_FAMILIES: dict[str, EvalFamily] = {}
_REPLAY_FAMILIES: dict[str, ReplayFamily] = {}
_discovered = False


def eval_family(
    name: str,
    *,
    builders: dict[str, Builder],
    task: str,
    system_prompt: str | None = None,
    reference_answer: Callable[[Any], str] | None = None,
    report: str | None = None,
) -> Callable[[Verifier], Verifier]:
    """Decorator: register the decorated verifier as family ``name`` with its builders and task."""
    if not builders:
        raise GeneratorError(f"eval family {name!r} registers no task-type builders")
    if ":" not in task:
        raise GeneratorError(f"eval family {name!r}: task must be 'module:function', got {task!r}")
    if report is not None and ":" not in report:
        raise GeneratorError(f"eval family {name!r}: report must be 'module:function', got {report!r}")

    def register(verify: Verifier) -> Verifier:
        known = _FAMILIES.get(name)
        origin = (verify.__module__, verify.__qualname__)
        if known is not None and (known.verify.__module__, known.verify.__qualname__) != origin:
            raise GeneratorError(f"eval family {name!r} is registered twice ({known.verify.__module__})")
        _FAMILIES[name] = EvalFamily(name=name, builders=dict(builders), verify=verify, task=task,
                                     system_prompt=system_prompt, reference_answer=reference_answer,
                                     report=report)  # fmt: skip
        return verify

    return register


def replay_family(
    name: str, *, task: str, options: dict[str, str] | None = None, required: tuple[str, ...] = ()
) -> ReplayFamily:
    """Register the replay family ``name`` (called from the family's ``__init__``); returns it."""
    if ":" not in task:
        raise GeneratorError(f"replay family {name!r}: task must be 'module:function', got {task!r}")
    family = ReplayFamily(name=name, task=task, options=dict(options or {}), required=required)
    known = _REPLAY_FAMILIES.get(name)
    if name in _FAMILIES or (known is not None and known.task != task):
        raise GeneratorError(f"eval family {name!r} is registered twice")
    _REPLAY_FAMILIES[name] = family
    return family


def replay_family_names() -> tuple[str, ...]:
    """Every registered replay family, sorted by name."""
    _discover()
    return tuple(sorted(_REPLAY_FAMILIES))


def get_replay_family(name: str) -> ReplayFamily:
    """The registered replay family ``name``; GeneratorError when there is none."""
    _discover()
    if name not in _REPLAY_FAMILIES:
        raise GeneratorError(f"unknown replay family {name!r} (allowed: {', '.join(replay_family_names())})")
    return _REPLAY_FAMILIES[name]


def _discover() -> None:
    """Import the built-in family folders, then every ``tandem.families`` entry point, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import evalsuite.families as builtin

    for module in sorted(pkgutil.iter_modules(builtin.__path__), key=lambda m: m.name):
        importlib.import_module(f"{builtin.__name__}.{module.name}")
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as exc:
            raise GeneratorError(
                f"eval family entry point {entry_point.name} = {entry_point.value!r} failed to load: {exc}"
            ) from exc
        log.debug("event=family_entry_point name=%s value=%s", entry_point.name, entry_point.value)


def family_names() -> tuple[str, ...]:
    """Every registered family, sorted by name."""
    _discover()
    return tuple(sorted(_FAMILIES))


def get_family(name: str) -> EvalFamily:
    """The registered family ``name``; an unknown name is a :class:`GeneratorError` listing the known ones."""
    _discover()
    if name not in _FAMILIES:
        raise GeneratorError(f"unknown family {name!r} (allowed: {', '.join(family_names())})")
    return _FAMILIES[name]


def families() -> list[EvalFamily]:
    """Every registered family, sorted by name."""
    return [get_family(name) for name in family_names()]
