"""The `long` tier (issue 18): the same weights served past their window by RoPE scaling.

Unit: the extension's vLLM arguments. Integration: `tandem serve` with a tiny random Llama whose window is 256
tokens, as `tiny-standard` and as `tiny-long` (YaRN x16, 4,096 tokens): a 300-token prompt is a 400 naming
the 256-token limit on the standard id and answered on the long one. vLLM refuses a max_model_len over a
256-token model unless the scaled RoPE configuration reached it, so the answer is evidence of both. A seeded
2,500-token prompt is answered too: longer than vLLM's default 2,048-token prefill chunk, it would kill a CPU
engine that chunks it (the tiers prefill whole on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.config import TandemConfig
from serving.tiers import ContextExtension, extension_kwargs, model_window
from tests.conftest import REPO, free_port, wait_until_serving

WINDOW = 256


def _tiny_llama(out_dir: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from infra.bundled import prepare_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(prepare_bundled_model())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention has no kernel for 16
        num_key_value_heads=1,
        max_position_embeddings=WINDOW,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_extension_arguments_scale_the_window(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    rope = {"rope_theta": 100000.0, "rope_type": "default"}
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192, "rope_parameters": rope}))
    assert model_window(model) == 8192
    yarn = extension_kwargs(ContextExtension(method="yarn", factor=4), model, None)
    assert yarn["max_model_len"] == 32768
    assert yarn["hf_overrides"] == {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 100000.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 32768,  # YaRN configs carry the scaled window
    }
    linear = extension_kwargs(ContextExtension(method="linear", factor=2), model, 12000)
    assert linear["max_model_len"] == 12000 and "max_position_embeddings" not in linear["hf_overrides"]


def test_a_long_tier_needs_its_extension() -> None:
    with pytest.raises(ValueError, match="needs context_extension"):
        TandemConfig.model_validate(
            {"tiers": [{"name": "standard", "model_id": "s"}, {"name": "long", "model_id": "l"}]}
        )


@pytest.mark.integration
@pytest.mark.slow
def test_a_prompt_past_the_window_is_served_only_by_the_long_tier(tmp_path: Path) -> None:
    model = _tiny_llama(tmp_path / "tiny")
    port = free_port()
    engine = {"dtype": "float32", "max_num_seqs": 2, "extra": {"kv_cache_memory_bytes": 64 * 2**20}}
    config = {
        "registry": f"file://{tmp_path / 'registry'}",
        "model": str(model),
        "engine": engine,
        "tiers": [
            {"name": "standard", "model_id": "tiny-standard"},
            {
                "name": "long",
                "model_id": "tiny-long",
                "context_extension": {"method": "yarn", "factor": 16},
            },
        ],
        "server": {"host": "127.0.0.1", "port": port},
        "gateway": {"auth": {"mode": "none"}},
        "ray": {"num_cpus": 6},
    }
    config_path = tmp_path / "tandem.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = tmp_path / "serve.log"
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"lt-{os.getpid()}"  # short: Ray's socket paths
    work.mkdir(exist_ok=True)
    with log.open("w") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--config", str(config_path)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(work)},
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(serve, base_url, log, 300)
        models = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]
        windows = {m["id"]: m["metadata"]["max_request_context_length"] for m in models}
        assert windows == {"tiny-standard": WINDOW, "tiny-long": 16 * WINDOW}  # the engines' own limits
        prompt = [{"role": "user", "content": "word " * 300}]  # ~300 tokens with the chat template
        body = {"messages": prompt, "max_tokens": 4, "temperature": 0}
        standard = httpx.post(
            f"{base_url}/v1/chat/completions", json=body | {"model": "tiny-standard"}, timeout=120
        )
        assert standard.status_code == 400, standard.text
        error = standard.json()["error"]
        assert str(WINDOW) in error["message"] and error["type"] == "invalid_request_error", error
        long = httpx.post(f"{base_url}/v1/chat/completions", json=body | {"model": "tiny-long"}, timeout=120)
        assert long.status_code == 200, long.text
        assert long.headers["x-tandem-tier"] == "long"
        assert WINDOW < long.json()["usage"]["prompt_tokens"] <= 16 * WINDOW
        seeded = body | {"model": "tiny-long", "messages": [{"role": "user", "content": "word " * 2500}]}
        sampled = httpx.post(
            f"{base_url}/v1/chat/completions", json=seeded | {"temperature": 0.8, "seed": 7}, timeout=300
        )
        assert sampled.status_code == 200, sampled.text
        assert sampled.json()["usage"]["prompt_tokens"] > 2048
        assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200  # the engine lived
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(work)], check=False)
