"""The Serve application builder that `serve run` and KubeRay use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.serve_app import app_builder
from infra.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_invalid_args_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"args\.config: engine\.dtype"):
        app_builder({"config": {"engine": {"dtype": "fp3"}}})


def test_shipped_serve_config_points_at_this_builder() -> None:
    config = yaml.safe_load((REPO / "release" / "cluster" / "serve-config.yaml").read_text())
    application = config["applications"][0]
    module, _, name = application["import_path"].partition(":")
    assert (module, name) == ("gateway.serve_app", "app_builder")
    assert "config" in application["args"]
