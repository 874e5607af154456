"""Loaded by Inspect through the ``inspect_ai`` entry point: registers the ``bwrap`` sandbox and the tasks."""

from evalsuite.sandbox import BwrapSandboxEnvironment
from evalsuite.tasks import agent, documents, terminal

__all__ = ["BwrapSandboxEnvironment", "agent", "documents", "terminal"]
