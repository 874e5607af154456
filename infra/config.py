"""Parse YAML/JSON files into pydantic models at the edge, with errors that name file, field and allowed values."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

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


def load_model_file(path: Path, model: type[ModelT]) -> ModelT:
    """Read a YAML or JSON file into ``model``; every failure is a ConfigError naming the file."""
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
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, str(path))) from exc
