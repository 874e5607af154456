"""Loaded by Inspect through the ``inspect_ai`` entry point: registers the ``bwrap`` sandbox and the task of
every registered eval family (importing a task module is what registers its ``@task`` with Inspect)."""

from evalsuite.registry import families, get_replay_family, replay_family_names
from evalsuite.sandbox import BwrapSandboxEnvironment

for _family in families():
    _family.load_task()
for _name in replay_family_names():
    get_replay_family(_name).load_task()

__all__ = ["BwrapSandboxEnvironment"]
