"""Tiny random Llama checkpoints with the bundled tokenizer: cheap engines for tests and overhead benchmarks."""

from __future__ import annotations

from pathlib import Path

from infra.bundled import prepare_bundled_model

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_tiny_llama(out_dir: Path, *, layers: int = 2, hidden: int = 128, seed: int = 0) -> Path:
    """Write a randomly initialised Llama (bundled tokenizer and vocabulary) to ``out_dir``."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = prepare_bundled_model()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        # vLLM's CPU attention kernels need head_dim 64 or more.
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out_dir / name)
    return out_dir
