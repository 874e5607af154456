"""Multi-turn tool episodes with scripted policies (no model): real tool execution in the agent family's shop and
the terminal family's sandbox, the served vLLM parser, the seed's reward shape, the step and token budgets, and
SFT transcripts that round-trip through the same parser with the loss on the assistant tokens only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalsuite.generators import generate_instances
from evalsuite.schema import TaskInstance
from posttrain import TaskPool, TaskPoolConfig
from posttrain.config import EpisodeConfig
from posttrain.episodes import (
    Episode,
    EpisodeTooLong,
    Generation,
    demonstration,
    environment_for,
    play,
    renderer_for,
)

BWRAP = Path("/usr/bin/bwrap").exists()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from infra.bundled import prepare_bundled_model

    return AutoTokenizer.from_pretrained(prepare_bundled_model())


class ScriptedPolicy:
    """Answers each turn with the next scripted text (then the last one again), closed by the eos token."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Generation:
        self.prompts.append(list(prompt_ids))
        text = self.turns[min(len(self.prompts) - 1, len(self.turns) - 1)]
        ids = [*self.tokenizer(text, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id]
        ids = ids[:max_tokens]
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), policy_version=3)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A turn calling one tool in the Hermes format the bundled model's template uses."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def agent_instance(mutating: bool = True) -> TaskInstance:
    """A train-split agent instance whose reference solution changes the shop (or, not ``mutating``, does not)."""
    changes = {"cancel_order", "refund_order", "create_order", "update_address"}
    for instance in generate_instances("agent", "train", 24, seed=5):
        names = {call["name"] for call in instance.expected["reference_calls"]}
        if bool(names & changes) == mutating:
            return instance
    raise AssertionError("no such agent instance in 24")


def run(tokenizer: Any, policy: Any, instance: TaskInstance, **budgets: int) -> Episode:
    limits = {"max_turn_tokens": 256, "max_total_tokens": 4096} | budgets
    return play(policy, instance, tokenizer, EpisodeConfig(), **limits)


def test_a_scripted_policy_solves_an_agent_instance_through_the_shop_and_earns_the_full_reward(
    tokenizer: Any,
) -> None:
    instance = agent_instance()
    calls = instance.expected["reference_calls"]
    policy = ScriptedPolicy(tokenizer, [call_text(c["name"], c["arguments"]) for c in calls] + ["All done."])
    episode = run(tokenizer, policy, instance)

    assert episode.ended == "replied" and episode.turns == len(calls) + 1
    assert episode.reward == 1.0 and episode.verdict.correct, episode.verdict.explanation
    assert [c.name for c in episode.calls] == [c["name"] for c in calls]
    assert all(c.error is None for c in episode.calls)
    # Each result came from executing the call: the first one's result is the shop's answer to it.
    first_result = json.loads(episode.transcript[1]["content"])
    assert episode.transcript[1]["role"] == "tool" and isinstance(first_result, dict | list)
    # The policy was fed its own turns and the tool turns, token for token, as the sequence the learner trains on.
    assert (
        policy.prompts[-1]
        == episode.prompt_ids + episode.completion_ids[: len(policy.prompts[-1]) - len(episode.prompt_ids)]
    )
    assert len(episode.completion_ids) == len(episode.loss_mask) == len(episode.logprobs)
    assert episode.policy_versions == [3] * episode.turns


def test_a_policy_that_calls_a_forbidden_tool_earns_nothing(tokenizer: Any) -> None:
    instance = agent_instance()
    customer = next(iter(instance.expected["initial_state"]["customers"]))
    calls = instance.expected["reference_calls"]
    turns = [call_text("delete_customer", {"customer_id": customer})]
    turns += [call_text(c["name"], c["arguments"]) for c in calls] + ["Done."]
    episode = run(tokenizer, ScriptedPolicy(tokenizer, turns), instance)

    assert episode.calls[0].name == "delete_customer" and episode.calls[0].error is None  # it did run
    assert episode.reward == 0.0 and not episode.verdict.correct
    assert "forbidden: delete_customer" in episode.verdict.explanation


def test_a_policy_past_the_step_budget_is_cut_off_and_loses_the_budget_credit(tokenizer: Any) -> None:
    instance = agent_instance(mutating=False)
    order = next(iter(instance.expected["initial_state"]["orders"]))
    episode = run(
        tokenizer, ScriptedPolicy(tokenizer, [call_text("get_order", {"order_id": order})]), instance
    )

    slack = EpisodeConfig().turn_slack
    assert episode.ended == "turn_limit" and episode.turns == instance.max_steps + slack
    assert len(episode.calls) == instance.max_steps + slack
    assert episode.verdict.components["budget"] == 0.0 and not episode.verdict.correct
    assert episode.reward < 0.9
    # No tool turn dangles after the last turn: the sequence ends on the policy's own eos.
    assert episode.completion_ids[-1] == tokenizer.eos_token_id and episode.loss_mask[-1] == 1


def test_the_token_budget_cuts_an_episode_and_closes_a_cut_turn_outside_the_loss(tokenizer: Any) -> None:
    instance = agent_instance()
    calls = instance.expected["reference_calls"]
    policy = ScriptedPolicy(tokenizer, [call_text(c["name"], c["arguments"]) for c in calls] + ["Done."])
    prompt = len(renderer_for("agent", tokenizer).prompt_ids(environment_for("agent").messages(instance)))
    episode = run(tokenizer, policy, instance, max_turn_tokens=8, max_total_tokens=prompt + 20)

    assert episode.ended in ("replied", "token_limit")
    assert len(episode.prompt_ids) + len(episode.completion_ids) <= prompt + 20
    # A turn cut at 8 tokens is closed with an eos that is not the policy's (mask 0, log-prob 0).
    assert episode.completion_ids[8] == tokenizer.eos_token_id and episode.loss_mask[8] == 0
    assert not episode.calls and not episode.verdict.correct  # a cut call never parses
    with pytest.raises(EpisodeTooLong, match=r"train\.max_length"):
        run(tokenizer, policy, instance, max_total_tokens=prompt)


def test_malformed_and_unknown_calls_are_rejected_as_served(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    instance = agent_instance()
    turns = [
        call_text("teleport_order", {"order_id": "x"}),
        '<tool_call>\n{"name": "get_order", "arguments": "ORD-1"}\n</tool_call>',
        "<tool_call>\n{not json}\n</tool_call>",
    ]
    episode = run(tokenizer, ScriptedPolicy(tokenizer, turns), instance)

    assert [c.name for c in episode.calls] == ["teleport_order", "get_order"]
    assert "unknown tool" in str(episode.calls[0].error) and "JSON object" in str(episode.calls[1].error)
    assert episode.transcript[1]["content"].startswith("Error: ")
    # The served parser reads unparseable JSON as a plain reply: the episode ends there, as it would served.
    assert episode.ended == "replied" and episode.turns == 3
    assert episode.verdict.components["protocol"] == 0.5
    # A policy's malformed turn is an outcome, not a fault: vLLM's parser traceback is not logged for it.
    assert not [r for r in caplog.records if r.exc_info or "extracting tool call" in r.getMessage()]


@pytest.mark.skipif(not BWRAP, reason="bubblewrap not installed")
def test_a_terminal_episode_runs_commands_in_its_sandbox_and_gets_their_output_back(tokenizer: Any) -> None:
    (instance,) = generate_instances("terminal", "train", 1, seed=0)
    name = sorted(instance.files)[0]
    first_line = instance.files[name].splitlines()[0]
    turns = [
        call_text("bash", {"command": f"head -n 1 {name} && echo to-stderr >&2"}),
        call_text("bash", {"command": instance.expected["reference_solution"]}),
        "Done.",
    ]
    episode = run(tokenizer, ScriptedPolicy(tokenizer, turns), instance)

    output = episode.transcript[1]["content"]
    assert episode.transcript[1]["role"] == "tool" and output == f"to-stderr\n\n{first_line}\n"
    assert output in tokenizer.decode(episode.completion_ids)  # the tool turn the policy was fed
    assert episode.reward == 1.0 and episode.verdict.correct, episode.verdict.explanation
    # A second episode starts from a fresh sandbox: the first one's output files are not there.
    fresh = run(
        tokenizer, ScriptedPolicy(tokenizer, [call_text("bash", {"command": "ls"}), "Done."]), instance
    )
    assert fresh.transcript[1]["content"].split() == sorted({p.split("/")[0] for p in instance.files})
    assert not fresh.verdict.correct


@pytest.mark.parametrize(
    "family", ["agent", pytest.param("terminal", marks=pytest.mark.skipif(not BWRAP, reason="bwrap"))]
)
def test_sft_transcripts_of_reference_solutions_round_trip_through_the_served_parser(
    tokenizer: Any, family: str
) -> None:
    config = EpisodeConfig()
    renderer = renderer_for(family, tokenizer)
    for instance in generate_instances(family, "train", 4, seed=2):
        episode = demonstration(instance, tokenizer, config, 4096)
        assert episode.verdict.correct and episode.reward == 1.0, episode.verdict.explanation

        # The loss mask covers exactly the assistant turns: each run of masked tokens is one turn, ending in eos.
        spans: list[list[int]] = [[]]
        for token, masked in zip(episode.completion_ids, episode.loss_mask, strict=True):
            if masked:
                spans[-1].append(token)
            elif spans[-1]:
                spans.append([])
        spans = [span for span in spans if span]
        assert all(span[-1] == tokenizer.eos_token_id for span in spans)
        parsed = [renderer.protocol.parse(renderer.turn_text(span)) for span in spans]
        reference = environment_for(family).reference_turns(instance)
        assert [[(c.name, c.arguments) for c in turn.calls] for turn in parsed[:-1]] == [
            [(c.name, c.arguments) for c in turn] for turn in reference
        ]
        assert not parsed[-1].calls and parsed[-1].content == config.closing_reply

        # The whole sequence is the chat template's rendering of the conversation, tool results included.
        conversation = environment_for(family).messages(instance) + [
            {
                "role": m["role"],
                "content": m["content"],
                **(
                    {"tool_calls": [{"type": "function", "function": c} for c in m["tool_calls"]]}
                    if m.get("tool_calls")
                    else {}
                ),
            }
            for m in episode.transcript
        ]
        rendered = renderer.render(conversation)
        decoded = tokenizer.decode(episode.prompt_ids + episode.completion_ids, skip_special_tokens=False)
        assert decoded + renderer.turn_tail == rendered
        unmasked = [t for t, m in zip(episode.completion_ids, episode.loss_mask, strict=True) if not m]
        assert "<tool_response>" in tokenizer.decode(unmasked) and "<tool_call>" not in tokenizer.decode(
            unmasked
        )


def test_a_token_budget_without_room_for_a_turn_is_refused_naming_the_setting(tokenizer: Any) -> None:
    from infra.errors import ConfigError
    from posttrain.episodes import require_room_for_turns

    with pytest.raises(ConfigError, match=r"train\.max_length=1024 leaves no room.* tokens \(agent\)"):
        require_room_for_turns([agent_instance()], tokenizer, None, 1024, "train.max_length")
    require_room_for_turns([agent_instance()], tokenizer, None, 2048, "train.max_length")


def test_episode_verdicts_are_kept_as_scored_and_single_turn_ones_verified() -> None:
    from posttrain.distributed.scheduler import Scheduler, SchedulerConfig
    from posttrain.distributed.verdicts import scheduled_verdicts
    from posttrain.formats import format_for

    documents = generate_instances("documents", "train", 2, seed=0)
    played = {"score": 0.85, "correct": False, "components": {"goal": 1.0, "protocol": 0.0, "budget": 1.0}}
    texts = [format_for("documents").demonstration(documents[0]), "ignored: scored where it was played"]
    verdicts = scheduled_verdicts(Scheduler(SchedulerConfig()), "serial", 0, documents, texts, [None, played])
    assert verdicts[0][0].correct and verdicts[1][0].score == 0.85 and verdicts[1][1] == 0.0


def test_agent_and_terminal_are_accepted_for_training_as_episodes() -> None:
    from posttrain.cli import build_config
    from posttrain.stages import RLRunConfig, SFTRunConfig

    pool = TaskPool(TaskPoolConfig(families=["agent", "terminal", "documents"], instances_per_family=3))
    assert [pool.uses_episodes(f) for f in ("agent", "terminal", "documents")] == [True, True, False]
    single = TaskPool(
        TaskPoolConfig(families=["terminal"], instances_per_family=2, rollout={"terminal": "single_turn"})
    )
    assert not single.uses_episodes("terminal")
    for model in (SFTRunConfig, RLRunConfig):
        config = build_config(model, None, "m@v", "agent,terminal", {})
        assert config.pool.families == ["agent", "terminal"]
