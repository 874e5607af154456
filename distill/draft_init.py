"""Build a draft from a subset of the teacher's layers: same tokenizer, same (tied) embeddings, fewer layers.

The result is a plain Hugging Face Llama checkpoint directory, so vLLM loads it as a ``draft_model``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from distill.errors import DistillError, TokenizerMismatch

log = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def spread_layers(total: int, keep: int) -> list[int]:
    """``keep`` layer indices spread evenly over ``0..total-1``, always including the first and last."""
    if keep < 1 or keep > total:
        raise DistillError(f"cannot keep {keep} of {total} layers: choose between 1 and {total}")
    if keep == 1:
        return [0]
    return sorted({round(i * (total - 1) / (keep - 1)) for i in range(keep)})


def check_same_tokenizer(teacher_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary or tokenizer differs from the teacher's (before any training)."""
    from transformers import AutoConfig, AutoTokenizer

    teacher_cfg = AutoConfig.from_pretrained(teacher_dir)
    draft_cfg = AutoConfig.from_pretrained(draft_dir)
    if teacher_cfg.vocab_size != draft_cfg.vocab_size:
        raise TokenizerMismatch(
            f"draft {draft_dir} has vocab_size {draft_cfg.vocab_size}, teacher {teacher_dir} has "
            f"{teacher_cfg.vocab_size}: a draft must share the teacher's vocabulary"
        )
    teacher_tok = AutoTokenizer.from_pretrained(teacher_dir)
    draft_tok = AutoTokenizer.from_pretrained(draft_dir)
    if teacher_tok.get_vocab() != draft_tok.get_vocab():
        differing = len(set(teacher_tok.get_vocab().items()) ^ set(draft_tok.get_vocab().items()))
        raise TokenizerMismatch(
            f"draft {draft_dir} and teacher {teacher_dir} have different tokenizers "
            f"({differing} differing token-id pairs): a draft must share the teacher's tokenizer"
        )
    for attribute in ("eos_token_id", "bos_token_id"):
        if getattr(teacher_tok, attribute) != getattr(draft_tok, attribute):
            raise TokenizerMismatch(
                f"draft and teacher disagree on {attribute}: "
                f"{getattr(draft_tok, attribute)} vs {getattr(teacher_tok, attribute)}"
            )


def build_layer_subset_draft(
    teacher_dir: Path, out_dir: Path, keep_layers: list[int], *, dtype: str | None = None
) -> Path:
    """Write a draft checkpoint to ``out_dir`` holding the teacher's layers ``keep_layers`` (in order).

    Embeddings, final norm and (tied) LM head are copied unchanged; the tokenizer files are copied so the
    draft and the teacher tokenize identically.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    teacher_dir = Path(teacher_dir)
    config = AutoConfig.from_pretrained(teacher_dir)
    if getattr(config, "model_type", None) != "llama":
        raise DistillError(
            f"layer-subset drafts need a Llama teacher; {teacher_dir} is {config.model_type!r}"
        )
    total = int(config.num_hidden_layers)
    if not keep_layers or max(keep_layers) >= total:
        raise DistillError(f"keep_layers {keep_layers} out of range for a teacher with {total} layers")
    torch_dtype = getattr(torch, dtype) if dtype else None
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch_dtype)
    source = teacher.state_dict()

    draft_config = AutoConfig.from_pretrained(teacher_dir)
    draft_config.num_hidden_layers = len(keep_layers)
    if getattr(draft_config, "layer_types", None):
        draft_config.layer_types = [config.layer_types[i] for i in keep_layers]
    draft = AutoModelForCausalLM.from_config(draft_config, dtype=teacher.dtype)
    mapped = {}
    for key, tensor in source.items():
        if key.startswith("model.layers."):
            index = int(key.split(".")[2])
            if index not in keep_layers:
                continue
            rest = key.split(".", 3)[3]
            mapped[f"model.layers.{keep_layers.index(index)}.{rest}"] = tensor
        else:
            mapped[key] = tensor
    missing, unexpected = draft.load_state_dict(mapped, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not draft_config.tie_word_embeddings]
    if missing or unexpected:
        raise DistillError(f"layer subset did not map cleanly: missing={missing} unexpected={unexpected}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer_files(teacher_dir, out_dir)
    _record_origin(out_dir, keep_layers, total)
    log.info("event=draft_init teacher=%s keep_layers=%s out=%s", teacher_dir, keep_layers, out_dir)
    return out_dir


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)


def _record_origin(out_dir: Path, keep_layers: list[int], total: int) -> None:
    (out_dir / "draft_origin.json").write_text(
        json.dumps({"init": "layer_subset", "keep_layers": keep_layers, "teacher_layers": total}, indent=2)
    )
