"""EAGLE-3 heads: the training-time-test head against vLLM's eagle3 semantics, on tiny random Llamas.

The integration test trains a tiny head end to end (vLLM generation, features, training, publish) and has
vLLM load it as a fast tier: greedy output must be identical to the plain engine's (float32) one stream
at a time and 8 concurrent, and vLLM's own spec-decode counters must show accepted drafts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from distill.eagle3.config import Eagle3Config
from distill.eagle3.head import Eagle3Head, HeadShape, default_aux_layers, is_eagle3_dir
from distill.eagle3.training import chain_acceptance, choose_draft_vocab, make_batch, step_losses
from infra.registry import FileRegistry


def _shape(**overrides: object) -> HeadShape:
    values: dict[str, object] = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "target_vocab_size": 1000,
        "draft_vocab_size": 64,
        "aux_layers": [1, 2, 4],
    }
    values.update(overrides)
    return HeadShape.model_validate(values)


def test_default_aux_layers_are_distinct_and_match_vllm_for_real_depths() -> None:
    assert default_aux_layers(30) == [2, 15, 27]  # vLLM's Llama default for SmolLM2's 30 layers
    for layers in (2, 4, 6, 8, 12):
        chosen = default_aux_layers(layers)
        assert len(set(chosen)) == 3 and max(chosen) <= layers


def test_draft_vocabulary_maps_both_ways() -> None:
    rows = [{"output_ids": [5, 5, 5, 9, 9, 700]}, {"output_ids": [9, 42]}]
    vocab, coverage = choose_draft_vocab(rows, 3, 1000)
    assert vocab.tolist() == [5, 9, 42] or vocab.tolist() == [5, 9, 700]
    assert coverage == pytest.approx(7 / 8)
    head = Eagle3Head(_shape(draft_vocab_size=3))
    head.set_vocab(vocab)
    to_draft = head.target_to_draft()
    for draft_id, target_id in enumerate(vocab.tolist()):
        assert int(head.draft_to_target(torch.tensor(draft_id))) == target_id
        assert int(to_draft[target_id]) == draft_id
    assert int(to_draft[1]) == -1


@pytest.mark.parametrize("num_layers", [1, 2])
def test_later_steps_see_only_their_own_diagonal(num_layers: int) -> None:
    """Changing a future position must not change any step's logits at an earlier position (causality),
    and step 2 at position t must depend on step 1's output at t (the draft's own hidden state)."""
    torch.manual_seed(0)
    head = Eagle3Head(_shape(num_layers=num_layers)).eval()
    features = torch.randn(1, 6, 3 * 128)
    embeds = torch.randn(1, 8, 128)
    mask = torch.ones(1, 6, dtype=torch.long)
    with torch.no_grad():
        before = head(features, embeds, mask, 3)
        changed = features.clone()
        changed[0, 5] += 1.0
        after = head(changed, embeds, mask, 3)
    for step in range(3):
        assert torch.allclose(before[step][0, :5], after[step][0, :5], atol=1e-5)
        assert not torch.allclose(before[step][0, 5], after[step][0, 5])


def test_vllm_checkpoint_roundtrip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = Eagle3Head(_shape())
    head.set_vocab(torch.arange(0, 128, 2))
    head.save_vllm(tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 64 and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert is_eagle3_dir(tmp_path / "head")
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "head" / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "norm.weight"} <= names
    assert not any(name.startswith("embed_tokens") for name in names)  # vLLM shares the target's
    loaded = Eagle3Head.load_vllm(tmp_path / "head")
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_a_grown_head_drafts_as_before_and_saves_its_layers_as_vllm_numbers_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = Eagle3Head(_shape()).eval()
    head.set_vocab(torch.arange(0, 128, 2))
    grown = head.with_layers(3).eval()
    features, embeds, mask = torch.randn(2, 5, 3 * 128), torch.randn(2, 7, 128), torch.ones(2, 5)
    with torch.no_grad():
        for before, after in zip(
            head(features, embeds, mask, 3), grown(features, embeds, mask, 3), strict=True
        ):
            assert torch.allclose(before, after, atol=1e-6)
    with torch.no_grad():  # the new layers are live: moving their output projections changes the drafts
        grown.layers["2"].mlp.down_proj.weight.normal_()
        assert not torch.allclose(head(features, embeds, mask, 1)[0], grown(features, embeds, mask, 1)[0])

    grown.save_vllm(tmp_path / "grown")
    config = json.loads((tmp_path / "grown" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "grown" / "model.safetensors"))
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (128, 256)  # embedding + hidden state
    assert tensors["layers.1.self_attn.q_proj.weight"].shape == (128, 128)  # the residual stream alone
    assert {"layers.1.hidden_norm.weight", "layers.2.mlp.down_proj.weight"} <= set(tensors)
    loaded = Eagle3Head.load_vllm(tmp_path / "grown")
    assert loaded.shape.num_layers == 3
    for name, tensor in grown.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    with pytest.raises(ValueError, match="cannot shrink"):
        grown.with_layers(2)


def _published_head(
    registry: FileRegistry, tmp_path: Path, version: str, num_layers: int = 1, **metadata: object
) -> str:
    head = Eagle3Head(_shape(num_layers=num_layers))
    head.set_vocab(torch.arange(0, 128, 2))
    directory = head.save_vllm(tmp_path / f"head-{version}")
    return registry.publish(directory, "draft", version, kind="draft", metadata=metadata).ref


EAGLE3_OF_TINY = {"method": "eagle3", "teacher": "tiny@v1"}


@pytest.mark.parametrize(
    ("metadata", "target", "aux_layers", "message"),
    [
        ({"method": "eagle3", "teacher": "other@v1"}, {}, None, "drafted for other@v1, not for tiny@v1"),
        ({"method": "layer-subset", "teacher": "tiny@v1"}, {}, None, "not an eagle3 draft"),
        (EAGLE3_OF_TINY, {"vocab_size": 2000}, None, "target vocabulary is 1000, this run needs 2000"),
        (EAGLE3_OF_TINY, {"hidden_size": 256}, None, "hidden size is 128"),
        (EAGLE3_OF_TINY, {}, [0, 1, 2], r"aux layers is \[1, 2, 4\], this run needs \[0, 1, 2\]"),
    ],
)
def test_warm_start_refuses_a_head_of_another_shape_or_teacher(
    tmp_path: Path,
    metadata: dict[str, object],
    target: dict[str, int],
    aux_layers: list[int] | None,
    message: str,
) -> None:
    from types import SimpleNamespace

    from distill.eagle3.api import warm_start_head
    from distill.errors import DistillError
    from infra.manifest import ArtifactManifest

    registry = FileRegistry(tmp_path / "registry")
    ref = _published_head(registry, tmp_path, "v1", **metadata)
    teacher = ArtifactManifest(name="tiny", version="v1", kind="model", files=[])
    target_config = SimpleNamespace(**{"vocab_size": 1000, "hidden_size": 128, **target})
    config = Eagle3Config(teacher="tiny@v1", init_from=ref, aux_layers=aux_layers)
    with pytest.raises(DistillError, match=message):
        warm_start_head(registry, config, teacher, target_config)


def test_warm_start_grows_a_head_but_never_shrinks_one(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from distill.eagle3.api import warm_start_head
    from distill.errors import DistillError
    from infra.manifest import ArtifactManifest

    registry = FileRegistry(tmp_path / "registry")
    teacher = ArtifactManifest(name="tiny", version="v1", kind="model", files=[])
    target_config = SimpleNamespace(vocab_size=1000, hidden_size=128)
    one = _published_head(registry, tmp_path, "v1", **EAGLE3_OF_TINY)
    grown, _ = warm_start_head(
        registry, Eagle3Config(teacher="tiny@v1", init_from=one, head_layers=2), teacher, target_config
    )
    assert grown.shape.num_layers == 2 and "layers.1.mlp.down_proj.weight" in grown.state_dict()
    two = _published_head(registry, tmp_path, "v2", num_layers=2, **EAGLE3_OF_TINY)
    with pytest.raises(DistillError, match="the head has 2 layers, this run asks for 1"):
        warm_start_head(registry, Eagle3Config(teacher="tiny@v1", init_from=two), teacher, target_config)
    smaller = Eagle3Config(teacher="tiny@v1", init_from=one, draft_vocab_size=32)
    with pytest.raises(DistillError, match="drafts 64 tokens, this run asks for 32"):
        warm_start_head(registry, smaller, teacher, target_config)


def test_a_grown_vocabulary_keeps_the_trained_rows_and_starts_new_tokens_from_the_target() -> None:
    torch.manual_seed(0)
    head = Eagle3Head(_shape()).eval()
    old = torch.arange(0, 128, 2)
    head.set_vocab(old)
    rows = [{"output_ids": [501, 501, 501, 7, 777, 777]}]
    vocab, coverage = choose_draft_vocab(rows, 80, 1000, reserved=[3, 5, 999], keep=old.tolist())
    assert set(old.tolist()) | {3, 5, 999, 501, 777, 7} <= set(vocab.tolist()) and len(vocab) == 80
    assert coverage == 1.0
    target_rows = torch.randn(80, 128)
    grown = head.with_vocab(vocab, target_rows).eval()
    normed = torch.randn(4, 128)
    before, after = head.logits(normed), grown.logits(normed)
    to_new = grown.target_to_draft()
    for draft_id, token in enumerate(old.tolist()):
        assert torch.allclose(before[:, draft_id], after[:, to_new[token]])
    for token in (3, 501, 999):
        new_id = int(to_new[token])
        assert torch.equal(grown.lm_head.weight[new_id], target_rows[new_id])
    assert torch.equal(grown.fc.weight, head.fc.weight)
    assert grown.shape.draft_vocab_size == 80


def test_reserved_tokens_take_at_most_an_eighth_of_a_fresh_vocabulary() -> None:
    rows = [{"output_ids": [50] * 5 + [60] * 4 + [70] * 3 + list(range(100, 120))}]
    vocab, _ = choose_draft_vocab(rows, 16, 1000, reserved=[1, 2, 3, 4, 5])
    assert {1, 2} <= set(vocab.tolist()) and not {3, 4, 5} & set(vocab.tolist())
    assert {50, 60, 70} <= set(vocab.tolist()) and len(vocab) == 16


def test_warm_start_keeps_the_published_weights_and_vocabulary(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from distill.eagle3.api import warm_start_head
    from infra.manifest import ArtifactManifest

    torch.manual_seed(0)
    registry = FileRegistry(tmp_path / "registry")
    ref = _published_head(registry, tmp_path, "v1", method="eagle3", teacher="tiny@v1")
    published = Eagle3Head.load_vllm(registry.fetch(ref))
    teacher = ArtifactManifest(name="tiny", version="v1", kind="model", files=[])
    head, origin = warm_start_head(
        registry,
        Eagle3Config(teacher="tiny@v1", init_from=ref),
        teacher,
        SimpleNamespace(vocab_size=1000, hidden_size=128),
    )
    assert origin == "draft@v1"
    assert torch.equal(head.draft_to_target(torch.arange(64)), torch.arange(0, 128, 2))
    for name, tensor in published.state_dict().items():
        assert torch.equal(tensor, head.state_dict()[name]), name


def test_bundled_head_is_shipped_in_bfloat16_and_republished_as_it_was(tmp_path: Path) -> None:
    """distill.eagle3.bundle copies a registry head into the repo; a fresh registry gets the same ref,
    metadata and lineage back from it (infra.bundled.publish_bundled_drafts)."""
    from distill.eagle3.bundle import bundle_draft
    from infra.bundled import BUNDLED_REF, DRAFT_SPEC, publish_bundled_drafts
    from infra.errors import TandemError
    from infra.manifest import Lineage

    torch.manual_seed(0)
    head = Eagle3Head(_shape())
    head.set_vocab(torch.arange(0, 128, 2))
    head.save_vllm(tmp_path / "head")
    source = FileRegistry(tmp_path / "source")
    metadata = {"method": "eagle3", "num_speculative_tokens": 3, "expected_speedup": 1.4}
    lineage = Lineage(
        parents=[BUNDLED_REF], produced_by="tandem distill --method eagle3", config={"epochs": 3}
    )
    source.publish(tmp_path / "head", "tiny-eagle3", "r1", kind="draft", lineage=lineage, metadata=metadata)
    source.publish(tmp_path / "head", "other-eagle3", "r1", kind="draft", lineage=Lineage(parents=["x@y"]))

    shipped = bundle_draft(source, "tiny-eagle3@r1", out_root=tmp_path / "drafts")
    assert shipped == tmp_path / "drafts" / "tiny-eagle3@r1"
    from safetensors.torch import load_file

    weights = load_file(str(shipped / "model.safetensors"))
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == head.d2t.dtype
    assert torch.equal(weights["d2t"], head.d2t)
    assert json.loads((shipped / DRAFT_SPEC).read_text())["metadata"] == metadata
    with pytest.raises(TandemError, match="not a draft of"):
        bundle_draft(source, "other-eagle3@r1", out_root=tmp_path / "drafts")

    fresh = FileRegistry(tmp_path / "fresh")
    [manifest] = publish_bundled_drafts(fresh, root=tmp_path / "drafts")
    assert publish_bundled_drafts(fresh, root=tmp_path / "drafts") == []  # already there: left as it is
    assert manifest.ref == "tiny-eagle3@r1" and manifest.kind == "draft"
    assert manifest.metadata == metadata
    assert manifest.lineage.parents == [BUNDLED_REF] and manifest.lineage.config == {"epochs": 3}
    assert manifest.lineage.metrics == {"num_speculative_tokens": 3, "expected_speedup": 1.4}
    assert is_eagle3_dir(fresh.fetch(manifest.ref))


def test_acceptance_counts_chains_not_tokens() -> None:
    """Draft token j counts only when tokens 1..j were all right, as vLLM's verifier accepts them."""
    valid = torch.tensor([[True, True, True, True]])
    checks = [
        (torch.tensor([[True, True, False, True]]), valid),
        (torch.tensor([[True, False, True, True]]), valid),
        (torch.tensor([[False, True, True, True]]), valid),
    ]
    counts, denominators, positions = chain_acceptance(checks)
    assert counts == [3, 2, 1] and denominators == [4, 4, 4] and positions == 4


def test_step_losses_train_only_completion_labels() -> None:
    torch.manual_seed(0)
    head = Eagle3Head(_shape(draft_vocab_size=1000, target_vocab_size=1000))
    head.set_vocab(torch.arange(1000))
    embed = torch.nn.Embedding(1000, 128)
    ids = torch.randint(0, 1000, (12,))
    batch = make_batch([(ids, torch.randn(12, 3 * 128), 10)], 3)
    losses, checks = step_losses(head, embed, batch, 3, head.target_to_draft())
    assert all(torch.isfinite(part) for part in losses)
    # Prompt of 10 tokens, 12 in all: step 1 (label t+2) has labels at positions 10, 11 only -> t = 8, 9.
    assert checks[0][1].nonzero()[:, 1].tolist() == [8, 9]
    assert checks[2][1].nonzero()[:, 1].tolist() == [6, 7]  # step 3: label t+4


def test_soft_labels_are_the_targets_next_token_distribution() -> None:
    """Step j at base t learns the target's distribution read at position t+j+1 (the one that predicts
    token t+j+2), over the draft vocabulary only."""
    torch.manual_seed(0)
    head = Eagle3Head(_shape(draft_vocab_size=50, target_vocab_size=1000))
    head.set_vocab(torch.arange(0, 1000, 20))
    embed = torch.nn.Embedding(1000, 128)
    teacher = torch.randn(50, 128)
    ids = torch.randint(0, 1000, (12,))
    final = torch.randn(12, 128)
    batch = make_batch([(ids, torch.randn(12, 3 * 128), 6, final)], 2)
    losses, checks = step_losses(head, embed, batch, 2, head.target_to_draft(), teacher)
    with torch.no_grad():
        normed = head(batch.features.float(), embed(batch.input_ids[:, 1:14]).float(), batch.mask, 2)
    for j in range(2):
        rows = checks[j][1][0].nonzero()[:, 0]
        soft = torch.softmax(batch.final[0, rows + j + 1].float() @ teacher.T, -1)
        expected = -(soft * torch.log_softmax(head.logits(normed[j][0, rows]), -1)).sum(-1).mean()
        assert torch.allclose(losses[j], expected, atol=1e-4)
    hard, _ = step_losses(head, embed, batch, 2, head.target_to_draft())  # no teacher: one-hot labels
    assert not torch.allclose(hard[0], losses[0])


def _tiny_target(out_dir: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,  # vLLM's CPU attention needs head_dim >= 64
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Default-scale random weights: greedy output runs a short, context-dependent course into a
    # repeated token, which a head can learn from a few dozen prompts (wilder weights give noise).
    LlamaForCausalLM(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


SERVE_SCRIPT = textwrap.dedent(
    """
    import json, sys, asyncio
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    def main():
        spec = json.loads(open(sys.argv[1]).read())
        llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=512,
                  kv_cache_memory_bytes=128 << 20, disable_log_stats=False, seed=0,
                  speculative_config={"method": "eagle3", "model": spec["head"], "num_speculative_tokens": 3})
        params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
        single = [list(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts[:4]]
        batched = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:8], params, use_tqdm=False)]
        counters = {m.name: m.value for m in llm.get_metrics() if m.name in (
            "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")}
        open(sys.argv[2], "w").write(json.dumps({"single": single, "batched": batched, "counters": counters}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_tiny_head_trains_publishes_and_vllm_serves_it_losslessly(tmp_path: Path, bundled_dir: Path) -> None:
    from distill.eagle3.api import train_eagle3_head

    registry = FileRegistry(tmp_path / "registry")
    registry.publish(_tiny_target(tmp_path / "target", bundled_dir), "tiny", "v1", kind="model")
    config = Eagle3Config(
        teacher="tiny@v1",
        work_dir=tmp_path / "work",
        template_prompts=64,
        self_prompts=0,
        max_new_tokens=32,
        max_seq_len=160,
        draft_vocab_size=512,
        speculative_steps=3,
        epochs=5,
        tokens_per_batch=2048,
        learning_rate=3e-3,
        warmup_steps=5,
        eval_every=1000,
        compute_dtype="float32",
        generation_kv_cache_bytes=128 << 20,
        version="t1",
    )
    stages: list[str] = []
    manifest = train_eagle3_head(
        config, registry=registry, progress=lambda stage, done, total, status: stages.append(stage)
    )
    assert {"greedy completions", "held-out completions", "features train", "train head"} <= set(stages)
    assert manifest.ref == "tiny-eagle3@t1" and manifest.kind == "draft"
    assert manifest.lineage.parents == ["tiny@v1"]
    assert manifest.metadata["method"] == "eagle3"
    report = json.loads((registry.fetch(manifest.ref) / "eagle3_report.json").read_text())
    before, after = report["evaluations"][0], report["evaluations"][-1]
    # The tiny target's greedy output falls into a repeated token, so the head starts at 2.43 of 3 accepted.
    # Its next-token distributions are near-uniform (default-scale random weights), which makes the default
    # soft labels a weak signal: seeded and deterministic, training reaches 2.62 with them (2.81 with
    # one-hot labels); an untrained or broken loss stays at 2.43.
    assert after["mean_accepted"] > before["mean_accepted"] + 0.12, report["evaluations"]

    # Continuing from the published head (--init-from) on grown data: the same shards plus 16 further
    # prompts (the short last shard is generated and extracted again), its weights and vocabulary, grown
    # to two decoder layers (the new one starts as the identity, so the first evaluation is unchanged).
    continued = train_eagle3_head(
        config.model_copy(
            update={
                "init_from": manifest.ref,
                "epochs": 1,
                "version": "t2",
                "extra_prompts": 16,
                "head_layers": 2,
            }
        ),
        registry=registry,
    )
    assert continued.lineage.parents == ["tiny@v1", "tiny-eagle3@t1"]
    again = json.loads((registry.fetch(continued.ref) / "eagle3_report.json").read_text())
    assert again["init_from"] == "tiny-eagle3@t1"
    assert again["train_sequences"] == report["train_sequences"] + 16
    assert again["evaluations"][0]["mean_accepted"] == pytest.approx(after["mean_accepted"], abs=1e-3)
    first_vocab = Eagle3Head.load_vllm(registry.fetch(manifest.ref)).d2t
    assert torch.equal(Eagle3Head.load_vllm(registry.fetch(continued.ref)).d2t, first_vocab)
    assert json.loads((registry.fetch(continued.ref) / "config.json").read_text())["num_hidden_layers"] == 2

    heldout = [
        json.loads(line)
        for path in sorted((tmp_path / "work" / "data" / "heldout").glob("shard-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    spec = {
        "model": str(registry.fetch("tiny@v1")),
        "head": str(registry.fetch(continued.ref)),  # vLLM serves the two-layer head
        "prompts": [row["prompt_ids"] for row in heldout[:8]],
        "max_tokens": 32,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "serve.py").write_text(SERVE_SCRIPT)
    completed = subprocess.run(
        [sys.executable, str(tmp_path / "serve.py"), str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    served = json.loads((tmp_path / "out.json").read_text())
    reference = [row["output_ids"] for row in heldout[:8]]  # the plain float32 engine's greedy output
    assert served["single"] == reference[:4]
    assert served["batched"] == reference
    drafted = served["counters"]["vllm:spec_decode_num_draft_tokens"]
    accepted = served["counters"]["vllm:spec_decode_num_accepted_tokens"]
    assert drafted > 0 and accepted / drafted > 0.2, served["counters"]
