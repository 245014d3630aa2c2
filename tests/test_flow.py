"""Flow-GRPO's credit assignment and trajectory statistics against hand-computed values."""

import math

import pytest
import torch

from grpo_exp.rewards.math import make_math_reward
from grpo_exp.rollout.flow import (
    broadcast_to_turns,
    group_advantages,
    reward_by_turns,
    trajectory_statistics,
    turn_spans,
)
from grpo_exp.rollout.multiturn import Trajectory, scored_on_final_turn
from grpo_exp.text import stated_answer
from grpo_exp.verification.labels import built_in_labels


def test_group_advantages_normalise_each_trajectory_once_against_its_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    advantages = group_advantages(rewards)
    # group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57745
    assert advantages[0].tolist() == pytest.approx([0.86588, -0.86588, -0.86588, 0.86588], abs=1e-5)
    # group 2: mean 0.75, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5
    assert advantages[1].tolist() == pytest.approx([0.49990, 0.49990, 0.49990, -1.49970], abs=1e-5)
    assert advantages[2].tolist() == [0.0, 0.0, 0.0, 0.0]  # no spread, no signal
    assert group_advantages(rewards, scale=False)[1].tolist() == [0.25, 0.25, 0.25, -0.75]


def test_unscorable_trajectories_get_no_advantage_and_leave_the_baseline():
    # mean 0.5, sample std sqrt(2 * 0.25 / 1) = 0.70711 over the two scored members
    advantages = group_advantages(torch.tensor([[1.0, math.nan, 0.0]]))
    assert advantages.tolist()[0] == pytest.approx([0.70701, 0.0, -0.70701], abs=1e-5)


def test_the_outcome_reward_reaches_every_turn_whatever_their_number():
    # Three trajectories of one group with 1, 3 and 2 turns: a trajectory is one member, not three.
    advantages = group_advantages(torch.tensor([[1.0, 0.0, 1.0]]))[0].tolist()
    per_turn = broadcast_to_turns(advantages, [1, 3, 2])
    assert per_turn == [[advantages[0]], [advantages[1]] * 3, [advantages[2]] * 2]
    assert advantages[0] == advantages[2]  # same outcome, same advantage: turn counts do not weigh


def test_turn_spans_are_the_policy_tokens_between_observations():
    assert turn_spans([1, 1, 0, 0, 1, 1, 1, 0, 1]) == [(0, 2), (4, 7), (8, 9)]
    assert turn_spans([1, 1, 1]) == [(0, 3)]
    assert turn_spans([]) == []


def test_trajectory_statistics_count_each_trajectory_once():
    records = [
        {"num_turns": 1, "tool_calls": 0, "tool_errors": 0, "final_turn": "It is \\boxed{7}.", "cut": True},
        {"num_turns": 3, "tool_calls": 2, "tool_errors": 1, "final_turn": "", "cut": False},  # out of turns mid-call
        {"num_turns": 2, "tool_calls": 1, "tool_errors": 0, "final_turn": "So 408."},
        {"num_turns": 2, "tool_calls": 1, "tool_errors": 0, "final_turn": "The answer is \\boxed{12}."},
    ]
    stats = trajectory_statistics(records, [0.0, 0.0, 1.0, math.nan], stated_answer)
    assert stats["rollout/turns_mean"] == 2.0
    assert stats["rollout/turns_max"] == 3.0
    assert stats["rollout/tool_calls_mean"] == 1.0
    assert stats["rollout/tool_errors_mean"] == 0.25
    assert stats["rollout/tool_error_rate"] == 0.25
    assert stats["rollout/used_tool_frac"] == 0.75
    assert stats["rollout/final_answer_frac"] == 0.75
    assert stats["rollout/cut_frac"] == 0.25  # a call or a game's move, without an EOS, is not a cut turn
    assert stats["rollout/reward_by_turns/1"] == 0.0
    assert stats["rollout/reward_by_turns/2"] == 1.0  # the NaN reward is left out
    assert stats["rollout/reward_by_turns/3"] == 0.0
    assert reward_by_turns([1.0, 0.0, 1.0], [2, 2, 3]) == {2: 0.5, 3: 1.0}


def test_the_reward_sees_the_final_turn_never_the_tools_output():
    math_reward = scored_on_final_turn(make_math_reward(built_in_labels()))
    assert math_reward.__name__ == "math"  # TRL logs rewards/math/mean
    answered = Trajectory([0], turns=["<calc>12*34</calc>", "The answer is \\boxed{408}."], ended=True)
    # The observation holds 408, but the policy never stated an answer: max_turns ran out mid-call.
    unfinished = Trajectory([0], turns=["<calc>12*34</calc>", "<calc>408</calc>"], ended=False)
    wrong = Trajectory([0], turns=["<calc>12*34</calc>", "So \\boxed{407}."], ended=True)
    trajectories = [answered, unfinished, wrong]
    rewards = math_reward(
        completions=[[{"role": "assistant", "content": "<calc>12*34</calc>\n<result>408</result>\n..."}]] * 3,
        final_turn=[t.final_turn for t in trajectories],
        solution=["408"] * 3,
    )
    assert rewards == [1.0, 0.0, 0.0]


def test_the_tools_system_message_and_demo_come_before_the_task():
    from omegaconf import OmegaConf

    from grpo_exp.rollout.multiturn import MultiTurnRollout
    from support.config import compose_config

    cfg = compose_config(["rollout=multiturn"]).rollout
    task = [{"role": "user", "content": "Calculate 1 + 2."}]
    messages = MultiTurnRollout(cfg).messages(task)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == cfg.system and messages[-1] == task[0]
    with_system = MultiTurnRollout(cfg).messages([{"role": "system", "content": "Be brief."}, *task])
    assert with_system[0]["content"] == f"{cfg.system}\n\nBe brief." and len(with_system) == 4
    bare = OmegaConf.merge(cfg, {"system": None, "demo": []})
    assert MultiTurnRollout(bare).messages([{"role": "system", "content": "Be brief."}, *task]) == [
        {"role": "system", "content": "Be brief."},
        *task,
    ]
