"""Ray Serve application builder for ``serve run`` / ``serve deploy`` / KubeRay ``RayService``.

``import_path: gateway.serve_app:app_builder`` with ``args.config`` holding a ``TandemConfig`` mapping
(the schema of ``infra/tandem.yaml``) builds the same application ``tandem serve`` runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.app import build_gateway_app, prepare_release
from gateway.config import TandemConfig
from infra.config import describe_validation_error
from infra.errors import ConfigError


def app_builder(args: dict[str, Any]) -> Any:
    """Build the gateway application from Serve config ``args`` (``{"config": {...TandemConfig...}}``)."""
    try:
        config = TandemConfig.model_validate(args.get("config") or {})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "serve config args.config")) from exc
    return build_gateway_app(config, prepare_release(config))
