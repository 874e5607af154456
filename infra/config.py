"""Parse YAML/JSON files into pydantic models at the edge, with errors that name file, field and allowed values;
merge command-line overrides over a file; write JSON records; digest a config.

:func:`load_config` is the one "read the file, merge the overrides, validate" path every stage's CLI uses.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from infra.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: ``source: field.path: message (allowed: ...)``."""
    lines = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "<root>"
        message = error["msg"]
        allowed = (error.get("ctx") or {}).get("expected")
        if allowed and str(allowed) not in message:
            message += f" (allowed: {allowed})"
        lines.append(f"{source}: {location}: {message}")
    return "\n".join(lines)


def read_config_file(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML or JSON file (empty for an empty file); failures name the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def merge_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides`` on top: nested mappings merge key by key, anything else replaces.

    A None override means "not given" (a command-line flag left out) and keeps the value underneath.
    """
    merged = dict(data)
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_overrides(merged[key], value)
        elif isinstance(value, Mapping):
            merged[key] = merge_overrides({}, value)
        else:
            merged[key] = value
    return merged


def load_config(
    model: type[ModelT], path: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> ModelT:
    """Read ``path`` (optional), merge ``overrides`` over it (see :func:`merge_overrides`), validate into
    ``model``; every failure is a ConfigError naming the file (or "command line") and the field."""
    data = read_config_file(path) if path is not None else {}
    data = merge_overrides(data, overrides or {})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, str(path) if path else "command line")) from exc


def load_model_file(path: Path, model: type[ModelT]) -> ModelT:
    """Read a YAML or JSON file into ``model``; every failure is a ConfigError naming the file."""
    return load_config(model, Path(path))


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON, atomically (a reader never sees half a file); makes the parent.

    Values JSON cannot encode (paths, datetimes) are written as their ``str``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2, default=str))
    os.replace(partial, path)


def config_digest(config: BaseModel, *, include: Any = None, exclude: Any = None) -> str:
    """Hex sha256 of a config's fields (``include``/``exclude`` as in ``model_dump``), key order ignored.

    A checkpoint records it; resuming with another digest means another configuration.
    """
    payload = config.model_dump(mode="json", include=include, exclude=exclude)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
