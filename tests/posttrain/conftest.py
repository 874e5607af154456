"""Tiny random Llama models with the bundled tokenizer, and a throwaway registry, for posttrain tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-64 Llama saved with the bundled SmolLM2 tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from infra.bundled import prepare_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(prepare_bundled_model())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    directory = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture()
def registry_url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'registry'}"


@pytest.fixture(scope="session")
def vllm_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama that vLLM's CPU kernels accept (head_dim 64), with the bundled tokenizer."""
    from bench.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("vllm-tiny") / "model")
