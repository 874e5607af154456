"""EAGLE-3 training data that grows: more prompts extend the shards already generated and extracted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill.eagle3.api import select_training_prompts
from distill.eagle3.config import Eagle3Config
from distill.eagle3.generate import GenerationJob, _check_resumable, _pending, read_shards, shard_path
from distill.eagle3.prompts import extra_prompts, template_prompts, training_prompts
from distill.eagle3.task_prompts import task_prompts
from distill.eagle3.training import FeatureStore
from distill.errors import DistillError
from distill.prompts import load_prompts


def test_extra_prompts_extend_a_smaller_count_and_skip_the_excluded() -> None:
    base = training_prompts(300, [], seed=0)
    heldout = set(load_prompts(split="heldout"))
    more = extra_prompts(0, 800, {*base, *heldout})
    assert extra_prompts(0, 300, {*base, *heldout}) == more[:300]
    assert len(more) == len(set(more)) == 800
    assert not set(more) & ({*base, *heldout})
    # They are not the first bank's prompts again: most use the second bank's templates or topics.
    assert len(set(more) - set(template_prompts(0, 5000))) > 400


def test_a_continuation_round_answers_only_the_prompts_after_those_it_skips() -> None:
    heldout = load_prompts(split="heldout")
    full = Eagle3Config(teacher="t@v", template_prompts=300, self_prompts=0, extra_prompts=500)
    everything = select_training_prompts(full, [], heldout)
    later = full.model_copy(update={"skip_prompts": 600})
    assert select_training_prompts(later, [], heldout) == everything[600:]
    capped = later.model_copy(update={"max_prompts": 700})
    assert select_training_prompts(capped, [], heldout) == everything[600:700]
    # Its answers and features live apart from the full round's, and its checkpoints are its own.
    assert later.train_data_suffix() == "-from-600" and full.train_data_suffix() == ""
    assert later.data_digest() == full.data_digest()
    assert later.train_digest() != full.train_digest()
    with pytest.raises(DistillError, match="leaves none of the 700 training prompts"):
        select_training_prompts(capped.model_copy(update={"skip_prompts": 700}), [], heldout)


def test_the_task_bank_is_seeded_distinct_and_never_a_heldout_prompt() -> None:
    heldout = set(load_prompts(split="heldout"))
    bank = task_prompts(0, 100_000, set())
    assert len(bank) == len(set(bank)) > 1500
    assert not set(bank) & heldout  # not even before the caller's exclusion
    assert task_prompts(0, 300, set()) == bank[:300]
    first = task_prompts(0, 40, set())
    for kind in ("Write a SQL query", "Write a regular expression", "Write a bash command", "Translate '"):
        assert any(p.startswith(kind) for p in first), kind
    assert task_prompts(1, 300, set()) != bank[:300]
    assert not set(task_prompts(0, 300, set(bank[:10]))) & set(bank[:10])


def test_task_prompts_follow_the_extra_bank() -> None:
    heldout = load_prompts(split="heldout")
    full = Eagle3Config(teacher="t@v", template_prompts=300, self_prompts=0, extra_prompts=500)
    with_tasks = full.model_copy(update={"task_prompts": 200})
    prompts = select_training_prompts(with_tasks, [], heldout)
    assert prompts[:-200] == select_training_prompts(full, [], heldout)
    assert prompts[-200:] == task_prompts(0, 200, set(prompts[:-200]) | set(heldout))
    assert with_tasks.data_digest() == full.data_digest() and with_tasks.train_digest() != full.train_digest()


def _write_shard(job: GenerationJob, index: int, rows: int) -> Path:
    prompts = job.prompts[index * job.shard_size : index * job.shard_size + rows]
    path = shard_path(job.out_dir, index)
    path.write_text("".join(json.dumps({"prompt": p, "output_ids": [1]}) + "\n" for p in prompts))
    return path


def test_a_grown_prompt_list_regenerates_only_the_short_last_shard(tmp_path: Path) -> None:
    job = GenerationJob(prompts=[f"p{i}" for i in range(10)], out_dir=tmp_path, shard_size=4)
    full, short = _write_shard(job, 0, 4), _write_shard(job, 1, 2)  # an earlier run of 6 prompts
    _check_resumable(job)
    assert full.is_file() and not short.is_file()
    assert _pending(job) == [1, 2]


def test_a_smaller_job_reads_only_its_own_rows_of_a_grown_directory(tmp_path: Path) -> None:
    grown = GenerationJob(prompts=[f"p{i}" for i in range(10)], out_dir=tmp_path, shard_size=4)
    for index, rows in enumerate((4, 4, 2)):
        _write_shard(grown, index, rows)
    smaller = grown.model_copy(update={"prompts": grown.prompts[:6]})
    _check_resumable(smaller)
    assert not _pending(smaller)
    assert [row["prompt"] for row in read_shards(smaller)] == smaller.prompts
    assert len(read_shards(grown)) == 10


def test_a_shard_of_other_prompts_is_refused(tmp_path: Path) -> None:
    job = GenerationJob(prompts=[f"p{i}" for i in range(8)], out_dir=tmp_path, shard_size=4)
    _write_shard(job.model_copy(update={"prompts": [f"q{i}" for i in range(8)]}), 0, 4)
    with pytest.raises(DistillError, match="other prompts"):
        _check_resumable(job)


def test_features_of_a_short_last_shard_are_extracted_again(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    target = LlamaForCausalLM(config).eval()
    rows = [{"prompt_ids": [1, 2 + i % 50], "output_ids": [3 + i % 40, 4, 5]} for i in range(7)]
    store = FeatureStore(tmp_path)

    def extract(count: int) -> None:
        store.extract(target, rows[:count], [1, 2, 3], max_len=16, shard_rows=4, autocast_dtype=None)

    extract(5)
    assert [store.shard_rows(i) for i in range(2)] == [4, 1]
    first = store.shard(0).stat().st_mtime_ns
    extract(7)
    assert [store.shard_rows(i) for i in range(2)] == [4, 3]
    assert store.shard(0).stat().st_mtime_ns == first  # the full shard is kept as it was
    loaded = store.load(7)
    assert [e.ids.tolist() for e in loaded] == [r["prompt_ids"] + r["output_ids"] for r in rows]
    # A smaller run in the grown store keeps every shard and reads only its own sequences.
    extract(5)
    assert [store.shard_rows(i) for i in range(2)] == [4, 3]
    assert [e.ids.tolist() for e in store.load(5)] == [e.ids.tolist() for e in loaded[:5]]
