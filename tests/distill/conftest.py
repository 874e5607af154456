"""Tiny random Llama teachers built with the bundled tokenizer, published to a temporary registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.bundled import prepare_bundled_model
from infra.registry import FileRegistry


def build_tiny_llama(out_dir: Path, tokenizer_dir: Path, *, layers: int = 4, seed: int = 0) -> Path:
    """A 4-layer, 64-wide random Llama over the bundled vocabulary, with sharpened logits.

    A larger output scale makes the random teacher's next-token distributions peaked, so an untrained
    draft disagrees with it and distillation has something measurable to learn.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def bundled_dir() -> Path:
    return prepare_bundled_model()


@pytest.fixture(scope="session")
def tiny_teacher_registry(tmp_path_factory: pytest.TempPathFactory, bundled_dir: Path) -> FileRegistry:
    root = tmp_path_factory.mktemp("distill-registry")
    registry = FileRegistry(root / "registry")
    model_dir = build_tiny_llama(root / "tiny-teacher", bundled_dir)
    registry.publish(model_dir, "tiny-teacher", "v1", kind="model")
    return registry
