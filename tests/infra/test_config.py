"""Config files are parsed at the edge, with errors that name the file, the field and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import DEFAULT_CONFIG_PATH, TandemConfig, load_config
from infra.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tandem.yaml"
    path.write_text(text)
    return path


def test_shipped_config_is_valid() -> None:
    config = load_config(DEFAULT_CONFIG_PATH)
    assert {tier.model_id for tier in config.tiers} == {"tandem-standard", "tandem-fast"}
    fast = config.tier("fast")
    assert fast is not None and fast.speculative is not None and fast.speculative.method == "auto"


def test_the_shipped_long_tier_example_is_valid_once_uncommented(tmp_path: Path) -> None:
    text = DEFAULT_CONFIG_PATH.read_text()
    example = text.replace("  # - name: long", "  - name: long").replace("  #   ", "    ")
    assert example != text, "the commented `long` tier example is gone from infra/tandem.yaml"
    long = load_config(_write(tmp_path, example)).tier("long")
    assert long is not None and long.model_id == "tandem-long"
    assert long.context_extension is not None and long.context_extension.factor == 2


def test_tiers_inherit_model_and_engine() -> None:
    config = TandemConfig.model_validate(
        {
            "model": "mine@v2",
            "engine": {"dtype": "bfloat16"},
            "tiers": [{"name": "standard", "model_id": "s"}],
        }
    )
    assert config.tiers[0].model == "mine@v2"
    assert config.tiers[0].engine.dtype == "bfloat16"


def test_bad_enum_names_file_field_and_allowed_values(tmp_path: Path) -> None:
    path = _write(tmp_path, "engine:\n  dtype: fp8\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message and "engine.dtype" in message and "float32" in message


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.prot"):
        load_config(_write(tmp_path, "server:\n  prot: 8000\n"))


def test_duplicate_alias_and_missing_standard(tmp_path: Path) -> None:
    text = "tiers:\n  - {name: standard, model_id: a, aliases: [x]}\n  - {name: fast, model_id: b, aliases: [x]}\n"
    with pytest.raises(ConfigError, match="'x' is used twice"):
        load_config(_write(tmp_path, text))
    with pytest.raises(ConfigError, match="exactly one tier named 'standard'"):
        load_config(_write(tmp_path, "tiers:\n  - {name: fast, model_id: b}\n"))


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "tiers: [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"))
