"""The built-in eval families, one folder each (generator, verifier, task, prompt).

Every folder here is imported by :mod:`evalsuite.registry` on first use, and its ``__init__`` registers
the family with :func:`evalsuite.registry.eval_family`: adding a family is adding a folder.
"""
