"""rollout.turn_credit=discounted_return: each turn of a trajectory credited with its own discounted return, checked
by hand; an environment's step_rewards carried turn by turn; the rules; and a tiny run through TRL's loss."""

import math
import sys

import pytest
import torch

from grpo_exp.errors import UserError
from grpo_exp.rollout.environment import load_environments
from grpo_exp.rollout.flow import discounted_returns, group_advantages, token_advantages, turn_advantages
from grpo_exp.run.resolve import resolve
from grpo_exp.trainer.turn_credit import credited_turns, groups_with_turn_signal, per_token, turn_advantage_means
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_command
from tests.helpers.episodes import played, trained_steps, write_user_module

STEPPED = '''
class Stepped:
    """Find the secret digit: each wrong probe costs 0.25 (a step reward), the right one earns 1."""

    def reset(self, question, solution, **row):
        self.secret, self.step_rewards, self.found = int(solution) % 10, [], False
        return "A secret digit from 0 to 9."

    def probe(self, digit: int) -> str:
        """Whether the secret is this digit.

        Args:
            digit: the digit
        """
        self.found = digit == self.secret
        self.step_rewards.append(1.0 if self.found else -0.25)
        return "right" if self.found else "wrong"

    def get_reward(self) -> float:
        return sum(self.step_rewards)


class Keeps(Stepped):
    def get_reward(self):
        return 0.0

    def probe(self, digit: int) -> str:
        """Keeps a bad step reward.

        Args:
            digit: the digit
        """
        self.step_rewards.append("lots")
        return "?"


class NoReward:
    def reset(self, **row):
        self.step_rewards = []

    def probe(self, digit: int) -> str:
        """Rewards a step.

        Args:
            digit: the digit
        """
        self.step_rewards.append(1.0)
        return "ok"


def my_loss(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    return -(per_token_logps - per_token_logps.detach()).exp() * advantages.unsqueeze(1)


def rows(count: int = 24):
    return [{"question": f"Find the secret {i}.", "answer": str(i)} for i in range(count)]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    return write_user_module(tmp_path, monkeypatch, "stepped", STEPPED)


# ---- by hand -----------------------------------------------------------------------------------------------------


def test_each_turns_discounted_return_by_hand():
    """Step rewards 0.5, 0, 0.25; the trajectory's total 2.0 (its step rewards and 1.25 more: the last turn's);
    discount 0.5: G2 = 0.25 + 1.25 = 1.5, G1 = 0 + 0.5 * 1.5 = 0.75, G0 = 0.5 + 0.5 * 0.75 = 0.875."""
    assert discounted_returns([0.5, 0.0, 0.25], 2.0, 0.5) == [0.875, 0.75, 1.5]
    assert discounted_returns([0.5, 0.0, 0.25], 2.0, 1.0) == [
        2.0,
        1.5,
        1.5,
    ]  # discount 1: the first turn's is the total
    assert discounted_returns([0.0, 0.0], 1.0, 0.9) == pytest.approx([0.9, 1.0])  # no step rewards


def test_each_turns_advantage_by_hand():
    """A group of two: returns [0.875, 0.75, 1.5] (above) and [0.0] (one turn, total 0). The baseline is the mean first
    return, 0.4375; the scale the group's std of the first returns, |0.875 - 0| / sqrt(2) = 0.61872, + 1e-4."""
    advantages = turn_advantages([[0.875, 0.75, 1.5], [0.0]], group_size=2, scale="group")
    d = 0.875 / math.sqrt(2) + 1e-4
    assert advantages[0] == pytest.approx([0.4375 / d, 0.3125 / d, 1.0625 / d])
    assert advantages[0] == pytest.approx([0.706993, 0.504995, 1.716982], abs=1e-6)
    assert advantages[1] == pytest.approx([-0.706993], abs=1e-6)
    unscaled = turn_advantages([[0.875, 0.75, 1.5], [0.0]], group_size=2, scale="none")
    assert unscaled == [pytest.approx([0.4375, 0.3125, 1.0625]), pytest.approx([-0.4375])]


def test_without_step_rewards_and_discount_1_every_turn_gets_flow_grpos_advantage():
    totals = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 1.0]
    turns = [3, 1, 2, 4, 1, 2, 3, 1]
    advantages = credited_turns(
        [[0.0] * n for n in turns], torch.tensor(totals), step_weight=1.0, group_size=4, scale="group", discount=1.0
    )
    flow = group_advantages(torch.tensor(totals).view(2, 4)).flatten().tolist()
    for own, expected, n in zip(advantages, flow, turns, strict=True):
        assert own == pytest.approx([expected] * n, abs=1e-6)


def test_first_turns_without_spread_leave_the_later_turns_unscaled():
    """Both trajectories total 1.0 in two turns, discount 0.5: first returns 0.5 each (no spread), second 1.0. Divided
    by the std + 1e-4 they would be 0.5 / 1e-4 = 5000; unscaled they are 0.5."""
    advantages = credited_turns(
        [[0.0, 0.0], [0.0, 0.0]], torch.tensor([1.0, 1.0]), step_weight=1.0, group_size=2, scale="group", discount=0.5
    )
    assert advantages == [[0.0, 0.5], [0.0, 0.5]]
    assert groups_with_turn_signal(advantages, 2).tolist() == [True]
    # first returns equal but for float rounding: no spread either
    noisy = turn_advantages([[0.3, 1.0], [0.1 + 0.2, 1.0]], group_size=2, scale="group")
    assert noisy == [pytest.approx([0.0, 0.7]), pytest.approx([0.0, 0.7])]
    assert groups_with_turn_signal([[0.0], [0.0]], 2).tolist() == [False]


def test_step_rewards_take_their_components_weight_and_an_unscored_trajectory_gets_zero():
    """The environment component weighted 2: a step reward of 0.25 is 0.5 of the total 3.0 (so 2.5 is the last turn's);
    discount 1: returns [3.0, 2.5]. The other trajectory has no score (NaN): 0 on every turn, out of the baseline."""
    advantages = credited_turns(
        [[0.25, 0.0], [0.0, 0.0, 0.0]],
        torch.tensor([3.0, math.nan]),
        step_weight=2.0,
        group_size=2,
        scale="group",
        discount=1.0,
    )
    assert advantages == [[0.0, -0.5], [0.0, 0.0, 0.0]]  # baseline 3.0 (the only score), no spread: unscaled


def test_the_mean_advantage_of_each_turn():
    means = turn_advantage_means([[1.0, -1.0, 3.0], [0.0], [2.0, 0.0]])
    assert means == {"rollout/turn_advantage/1": 1.0, "rollout/turn_advantage/2": -0.5, "rollout/turn_advantage/3": 3.0}


def test_each_token_takes_its_turns_advantage():
    """Two turns of 2 and 3 policy tokens, an observation of 2 between them, one padding position after."""
    mask = [1, 1, 0, 0, 1, 1, 1, 0]
    assert token_advantages([0.5, -1.0], [2, 3], mask) == [0.5, 0.5, 0.0, 0.0, -1.0, -1.0, -1.0, 0.0]
    # cut by the length limit: the turns it holds
    assert token_advantages([0.5, -1.0], [2, 3], [1, 1, 0, 1]) == [0.5, 0.5, 0.0, -1.0]
    rows = per_token([[0.5, -1.0], [2.0]], [[2, 3], [1]], torch.tensor([mask, [1, 0, 0, 0, 0, 0, 0, 0]]))
    assert rows.tolist() == [[0.5, 0.5, 0.0, 0.0, -1.0, -1.0, -1.0, 0.0], [2.0, 0, 0, 0, 0, 0, 0, 0]]


def test_dapos_loss_on_policy_with_per_token_advantages_is_their_weighted_mean(tmp_path):
    """TRL's own loss takes the per-token advantages: on-policy every ratio is 1, so dapo's loss is -sum_t A_t / N
    over the N counted tokens."""
    from tests.helpers.tiny_trainer import generation_batch, make_trainer

    def by_index(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(tmp_path, by_index, prompts=2, overrides=["trainer.loss_type=dapo"])
    batch = generation_batch(trainer, prompts=2)
    batch.pop("old_per_token_logps", None)
    mask = batch["completion_mask"].float()
    batch["advantages"] = torch.linspace(-1.0, 1.0, mask.numel()).view_as(mask)
    batch["num_items_in_batch"] = mask.sum()
    expected = -(batch["advantages"] * mask).sum() / mask.sum()
    torch.testing.assert_close(trainer.compute_loss(trainer.model, batch), expected, atol=1e-5, rtol=1e-5)


# ---- the environment's step rewards, turn by turn -----------------------------------------------------------------


def play(environment: str, moves: list[str]):
    trajectory, episode, _ = played(f"stepped:{environment}", moves, {"question": "q", "solution": "7"}, 1.0)
    return trajectory, episode


def test_the_step_rewards_go_to_the_turns_that_earned_them(user_module):
    trajectory, episode = play("Stepped", ["<probe>3</probe>", "<probe>7</probe>", "It is 7."])
    assert trajectory.turn_rewards == [-0.25, 1.0, 0.0]
    assert trajectory.turn_tokens == [1, 1, 1]
    assert episode.reward == 0.75 and episode.failure is None


@pytest.mark.parametrize(
    "environment, why",
    [
        ("Keeps", "step_rewards is ['lots'], not a list of finite numbers"),
        ("NoReward", "keeps step_rewards but has no get_reward()"),
    ],
)
def test_step_rewards_that_are_not_numbers_or_parts_of_no_return_fail_the_episode(user_module, environment, why):
    trajectory, episode = play(environment, ["<probe>3</probe>", "done"])
    assert why in episode.failure
    assert trajectory.turn_rewards[0] == 0.0


# ---- the rules and a run ------------------------------------------------------------------------------------------


def credit_run(*overrides: str) -> list[str]:
    return [
        *TINY_RUN,
        "logger=none",
        "dataset=function",
        "dataset.function=stepped:rows",
        "rollout=environment",
        "reward=environment",
        "rollout.environment=stepped:Stepped",
        "rollout.max_turns=2",
        "rollout.turn_credit=discounted_return",
        "rollout.discount=0.9",
        "trainer.prompts_per_step=2",
        *overrides,
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm=rloo"], "algorithm=rloo computes its own"),
        (["+trainer.extra.multi_objective_aggregation=normalize_then_sum"], "normalize_then_sum"),
        (["trainer.loss_type=stepped:my_loss"], "takes one per completion"),
    ],
)
def test_per_turn_credit_needs_trls_estimator_aggregation_and_loss(user_module, overrides, message, no_model_loads):
    with pytest.raises(UserError, match=message):
        resolve(compose_config(credit_run(*overrides)))


def test_a_discount_without_per_turn_credit_is_refused(user_module, no_model_loads):
    with pytest.raises(UserError, match="rollout.discount"):
        resolve(compose_config([*credit_run("rollout.turn_credit=outcome")]))


def test_the_environments_load_once_with_their_step_rewards_checked_at_run_time(user_module):
    (env,) = load_environments("stepped:Stepped", 1.0).values()
    assert env.tool_names == ("probe",) and env.has_reward  # step_rewards is an attribute, no tool


@pytest.mark.e2e
def test_a_run_with_per_turn_credit_trains_through_trls_loss(user_module):
    """Two steps on the tiny model with the stepped environment and per-turn credit: TRL's loss takes the per-token
    advantages (one process; skip leaves no group out that has a turn signal)."""
    run = user_module / "run"
    args = credit_run("trainer.max_steps=2", "eval.before=false", "eval.after=false", f"hydra.run.dir={run}")
    result = run_command([sys.executable, "-m", "grpo_exp.train", *args], cwd=user_module)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = trained_steps(run, 2)
    # where the credit went, turn by turn (each process computes the same from every process's turns)
    assert all("rollout/turn_advantage/1" in step for step in steps)
