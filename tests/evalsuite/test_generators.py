from __future__ import annotations

import pytest

from evalsuite.errors import GeneratorError
from evalsuite.generators import generate_instance, generate_instances, task_types
from evalsuite.registry import family_names
from evalsuite.schema import DIFFICULTIES, split_of


@pytest.mark.parametrize("family", family_names())
def test_generation_is_deterministic(family: str) -> None:
    first = generate_instances(family, "dev", 9, seed=3)
    second = generate_instances(family, "dev", 9, seed=3)
    assert [i.model_dump() for i in first] == [i.model_dump() for i in second]
    assert generate_instances(family, "dev", 9, seed=4)[0].instance_id != first[0].instance_id


@pytest.mark.parametrize("family", family_names())
def test_splits_are_disjoint_and_labelled(family: str) -> None:
    ids: dict[str, set[str]] = {}
    for split in ("train", "dev", "test"):
        instances = [i for seed in range(3) for i in generate_instances(family, split, 12, seed=seed)]
        assert all(i.split == split and split_of(i.metadata["digest"]) == split for i in instances)
        ids[split] = {i.instance_id for i in instances}
    assert not ids["train"] & ids["dev"] and not ids["train"] & ids["test"] and not ids["dev"] & ids["test"]


def test_rotation_key_regenerates_only_the_test_split() -> None:
    test_a = {i.instance_id for i in generate_instances("documents", "test", 10, rotation_key="a")}
    test_b = {i.instance_id for i in generate_instances("documents", "test", 10, rotation_key="b")}
    assert not test_a & test_b
    train_a = [i.instance_id for i in generate_instances("documents", "train", 5, rotation_key="a")]
    assert train_a == [i.instance_id for i in generate_instances("documents", "train", 5, rotation_key="b")]


@pytest.mark.parametrize("family", family_names())
def test_every_task_type_and_tier_generates(family: str) -> None:
    for task_type in task_types(family):
        for difficulty in DIFFICULTIES:
            instance = generate_instance(family, task_type, difficulty, seed=11)
            assert instance.prompt and instance.task_type == task_type and instance.difficulty == difficulty
    tiers = {i.difficulty for i in generate_instances(family, "train", 3 * len(task_types(family)))}
    assert tiers == set(DIFFICULTIES)


def test_hard_documents_are_longer_and_needle_depth_recorded() -> None:
    easy = generate_instance("documents", "needle", "easy", 5)
    hard = generate_instance("documents", "needle", "hard", 5)
    assert len(hard.prompt) > 5 * len(easy.prompt)
    assert 0 < hard.metadata["depth"] < 1


def test_hidden_tests_never_in_visible_files() -> None:
    for instance in generate_instances("terminal", "test", 10, task_type="fix_bug"):
        assert instance.hidden_files and not set(instance.hidden_files) & set(instance.files)
        assert all("assert" not in text for text in instance.files.values())
        assert "assert" not in instance.prompt


def test_unknown_family_and_type_are_errors() -> None:
    with pytest.raises(GeneratorError):
        generate_instances("poetry", "test", 1)
    with pytest.raises(GeneratorError):
        generate_instances("terminal", "test", 1, task_type="nope")
