"""Loaded by Inspect through the ``inspect_ai`` entry point: registers the ``bwrap`` sandbox and the task of
every registered eval family (importing a task module is what registers its ``@task`` with Inspect)."""

from evalsuite.registry import families
from evalsuite.sandbox import BwrapSandboxEnvironment

for _family in families():
    _family.load_task()

__all__ = ["BwrapSandboxEnvironment"]
