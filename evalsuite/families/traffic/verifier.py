"""Automatic scores for replayed traffic: JSON answers and tool calls, checked with ``jsonschema``.

An item's ``signal`` says which check applies; an item without one has no automatic score.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from evalsuite.schema import VerifierResult


def response_schema(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` of type ``json_schema`` asks for, else None."""
    if not response_format or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    return dict(schema) if isinstance(schema, Mapping) else None


def _schema_errors(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    """Messages of every violation of ``schema`` by ``instance`` (the schema's own draft, or 2020-12)."""
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(instance)
    ]


def verify_json(answer: str, response_format: Mapping[str, Any] | None) -> VerifierResult:
    """1 when ``answer`` is a JSON document (whitespace around it allowed, no Markdown fence: a client that
    asked for JSON parses the body as is) and, when the request gave a schema, valid against it."""
    try:
        document = json.loads(answer)
    except json.JSONDecodeError as exc:
        return VerifierResult(
            score=0.0, correct=False, components={"parses": 0.0}, explanation=f"not JSON: {exc}"
        )
    schema = response_schema(response_format)
    if schema is None:
        return VerifierResult(score=1.0, correct=True, components={"parses": 1.0}, explanation="valid JSON")
    try:
        errors = _schema_errors(document, schema)
    except SchemaError as exc:
        # The request's own schema is broken: validity is all that can be judged.
        return VerifierResult(
            score=1.0,
            correct=True,
            components={"parses": 1.0},
            explanation=f"valid JSON; the request's schema is invalid ({exc.message}), not checked",
        )
    valid = not errors
    return VerifierResult(
        score=float(valid),
        correct=valid,
        components={"parses": 1.0, "schema": float(valid)},
        explanation="valid JSON matching the schema"
        if valid
        else "schema violations: " + "; ".join(errors[:5]),
    )


def _tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") or {}
        if isinstance(function.get("name"), str):
            schemas[function["name"]] = dict(function.get("parameters") or {"type": "object"})
    return schemas


def verify_tool_calls(
    tool_calls: Sequence[Mapping[str, Any]] | None, tools: Sequence[Mapping[str, Any]] | None
) -> VerifierResult:
    """1 when the answer makes at least one tool call and every call names one of ``tools`` with arguments
    (a JSON object) valid against that tool's parameter schema; the score is the share of valid calls.

    ``tool_calls`` are in the OpenAI shape: ``{"function": {"name": ..., "arguments": "<JSON text>"}}``.
    """
    if not tool_calls:
        return VerifierResult(
            score=0.0, correct=False, components={"called": 0.0}, explanation="no tool call"
        )
    schemas = _tool_schemas(tools)
    problems: list[str] = []
    valid = 0
    for call in tool_calls:
        function = call.get("function") or {}
        name = function.get("name")
        if name not in schemas:
            problems.append(f"{name!r} is not one of the tools ({', '.join(sorted(schemas)) or 'none'})")
            continue
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            problems.append(f"{name}: arguments are not JSON: {exc}")
            continue
        if not isinstance(parsed, dict):
            problems.append(f"{name}: arguments are not a JSON object")
            continue
        try:
            errors = _schema_errors(parsed, schemas[name])
        except SchemaError as exc:
            errors = []
            problems.append(f"{name}: the tool's schema is invalid ({exc.message}), arguments not checked")
        if errors:
            problems.append(f"{name}: " + "; ".join(errors[:5]))
            continue
        valid += 1
    score = valid / len(tool_calls)
    correct = valid == len(tool_calls)
    return VerifierResult(
        score=score,
        correct=correct,
        components={"called": 1.0, "valid_calls": score},
        explanation="every call names a tool with valid arguments" if correct else " | ".join(problems),
    )
