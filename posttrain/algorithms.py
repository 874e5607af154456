"""The registry of post-training algorithms (TRL style: each one is a run config paired with its trainer).

A config class registers itself with :func:`posttrain_algorithm`, naming its trainer as
``"module:function"`` (imported only when a run starts, so listing algorithms loads no torch or trl)::

    @posttrain_algorithm("sft", trainer="posttrain.sft:posttrain_sft")
    class SupervisedRunConfig(RunConfig): ...

``tandem posttrain <name>``, ``posttrain.posttrain_<name>`` and the release pipeline's ``posttrain.method``
all read this registry. The built-in algorithms are declared in :mod:`posttrain.stages`; a third-party
package adds one through an entry point in the ``tandem.posttrain_algorithms`` group naming the module
that registers it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeVar

from posttrain.errors import PosttrainError

if TYPE_CHECKING:
    from posttrain.config import RunConfig
    from posttrain.run import CandidateResult

ENTRY_POINT_GROUP = "tandem.posttrain_algorithms"
ConfigT = TypeVar("ConfigT", bound="type[RunConfig]")


@dataclass(frozen=True)
class PosttrainAlgorithm:
    """One algorithm: the config that holds every tunable and the trainer that runs it."""

    name: str
    config: type[RunConfig]
    trainer: str
    """``"module:function"`` taking ``(config, resume=...)`` and returning a :class:`CandidateResult`."""

    @property
    def summary(self) -> str:
        """The config's one-line description (the CLI command's help)."""
        return (self.config.__doc__ or self.name).strip().splitlines()[0]

    def load_trainer(self) -> Callable[..., CandidateResult]:
        """The trainer function (imports torch, transformers and trl)."""
        module, _, function = self.trainer.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]

    def train(self, config: RunConfig, resume: bool = True, **options: Any) -> CandidateResult:
        """Run the trainer on ``config`` (which must be this algorithm's config class)."""
        if not isinstance(config, self.config):
            raise PosttrainError(f"{self.name} takes a {self.config.__name__}, got {type(config).__name__}")
        return self.load_trainer()(config, resume=resume, **options)


_ALGORITHMS: dict[str, PosttrainAlgorithm] = {}
_discovered = False


def posttrain_algorithm(name: str, *, trainer: str) -> Callable[[ConfigT], ConfigT]:
    """Class decorator: register the decorated run config as algorithm ``name`` trained by ``trainer``."""
    if ":" not in trainer:
        raise PosttrainError(f"algorithm {name!r}: trainer must be 'module:function', got {trainer!r}")

    def register(config: ConfigT) -> ConfigT:
        _ALGORITHMS[name] = PosttrainAlgorithm(name=name, config=config, trainer=trainer)
        return config

    return register


def _discover() -> None:
    """Load every ``tandem.posttrain_algorithms`` entry point, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    # The built-in configs registered themselves already: the package's __init__ imports posttrain.stages
    # before anyone can reach this module.
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as exc:
            raise PosttrainError(
                f"post-training entry point {entry_point.name} = {entry_point.value!r} failed to load: {exc}"
            ) from exc


def algorithm_names() -> tuple[str, ...]:
    """Every registered algorithm, in registration order (sft, rl, dpo, then third-party ones)."""
    _discover()
    return tuple(_ALGORITHMS)


def get_algorithm(name: str) -> PosttrainAlgorithm:
    """The algorithm ``name``; an unknown one is a :class:`PosttrainError` listing the known ones."""
    _discover()
    if name not in _ALGORITHMS:
        raise PosttrainError(f"unknown post-training algorithm {name!r} (allowed: {', '.join(_ALGORITHMS)})")
    return _ALGORITHMS[name]


def algorithms() -> list[PosttrainAlgorithm]:
    """Every registered algorithm, in registration order."""
    return [get_algorithm(name) for name in algorithm_names()]
