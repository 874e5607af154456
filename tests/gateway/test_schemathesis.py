"""Property-based run of the gateway's own OpenAPI schema (schemathesis): no input produces a 5xx.

Generated bodies keep every field schemathesis picks, except that the output size is capped
(max_tokens <= 4, n <= 2) so the run measures the API surface, not CPU decoding time.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import Gateway

pytestmark = pytest.mark.integration


def _cap(body: Any) -> None:
    if not isinstance(body, dict):
        return
    for field, cap in (("max_tokens", 4), ("max_completion_tokens", 4), ("n", 2), ("best_of", 2)):
        if isinstance(body.get(field), int) and not isinstance(body.get(field), bool) and body[field] > cap:
            body[field] = cap
    body.setdefault("max_tokens", 4)


def test_no_server_errors(gateway: Gateway) -> None:
    # schemathesis' pytest fixture loader does not run under pytest 9, so the run drives its
    # per-operation hypothesis strategies directly.
    schema = schemathesis.openapi.from_url(f"{gateway.base_url}/openapi.json")
    server_errors: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert any(op.path == "/v1/chat/completions" for op in operations)
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def exercise(case: Any) -> None:
            _cap(case.body)
            response = case.call(headers=gateway.auth, timeout=120)
            if response.status_code >= 500:
                server_errors.append(
                    f"{case.method} {case.path} -> {response.status_code}: {response.text[:200]}"
                )

        exercise()
    assert not server_errors, "\n".join(server_errors[:10])
