"""Advantage estimators (`algorithm=`): each against values worked out by hand, the default (grpo) TRL's to the bit,
a non-default one what TRL really trains with (tiny model, nothing mocked), and the config's rules."""

import math
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer

from grpo_exp.data import load_splits
from grpo_exp.errors import UserError
from grpo_exp.models import load_tokenizer
from grpo_exp.paths import CONF_DIR
from grpo_exp.run.resolve import resolve
from grpo_exp.trainer.advantages import (
    ESTIMATORS,
    TRL_ADVANTAGES,
    dr_grpo,
    estimate,
    pass_at_k,
    reinforce_pp_baseline,
    rloo,
)
from grpo_exp.trainer.config import grpo_exp_config
from grpo_exp.trainer.lm_head_positions import labelled_positions_only
from support.config import TINY_RUN, compose_config
from tests.helpers.tiny_trainer import PLAIN_TRL, Recording, knob_overrides

NAN = math.nan
# Three groups of G=4: two right of four, all right, one half-right answer among wrong ones.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0])


def close(actual: torch.Tensor, expected: list[float]) -> None:
    assert actual.dtype == torch.float32 and actual.shape == (len(expected),)
    assert actual.tolist() == pytest.approx(expected, abs=1e-6)


# ---- each estimator against hand-computed values ------------------------------------------------------------------


def test_dr_grpo_subtracts_the_group_mean_and_divides_by_nothing():
    # group means 0.5, 1, 0.125
    close(dr_grpo(REWARDS, 4), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.375, -0.125, -0.125, -0.125])


def test_rloo_subtracts_the_mean_of_the_other_completions():
    # 1 - (0+0+1)/3 = 2/3; 0 - (1+0+1)/3 = -2/3; 0.5 - 0 = 0.5; 0 - 0.5/3 = -1/6
    close(rloo(REWARDS, 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0, 0.5, -1 / 6, -1 / 6, -1 / 6])
    close(rloo(torch.tensor([3.0, 1.0]), 2), [2.0, -2.0])  # G=2: each against the other


def test_reinforce_pp_baseline_whitens_the_group_centred_rewards_over_the_whole_batch():
    # centred: 0.5 -0.5 -0.5 0.5 | 0 0 0 0 | 0.375 -0.125 -0.125 -0.125; batch mean 0;
    # sum of squares 4 * 0.25 + 0.140625 + 3 * 0.015625 = 1.1875; unbiased variance 1.1875 / 11
    scale = math.sqrt(1.1875 / 11 + 1e-8)
    centred = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.375, -0.125, -0.125, -0.125]
    close(reinforce_pp_baseline(REWARDS, 4), [c / scale for c in centred])
    # One group with spread in a batch of two: the other group's zeros count in the batch's variance.
    # centred 0.5 -0.5 0 0, unbiased variance 0.5 / 3
    scale = math.sqrt(0.5 / 3 + 1e-8)
    close(reinforce_pp_baseline(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2), [0.5 / scale, -0.5 / scale, 0, 0])


def test_pass_at_k_gives_the_papers_analytic_advantages():
    # N=4, k=2. [1,0,0,1]: N_neg=2, R = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5)/6,
    #   A_pos = (1/6)/sigma = 1/sqrt(5), A_neg = (1/6 - C(1,1)/C(3,1))/sigma = -1/sqrt(5).
    # [1,1,1,1]: sigma = 0 -> 0. [0.5,0,0,0] at threshold 0.5: 0.5 is not above it, all wrong -> 0.
    s5 = 1 / math.sqrt(5)
    close(pass_at_k(REWARDS, 4, k=2), [s5, -s5, -s5, s5, 0, 0, 0, 0, 0, 0, 0, 0])
    # [1,0,0,0], k=2: R = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2, A_pos = 1, A_neg = (1/2 - C(2,1)/C(3,1))/(1/2) = -1/3
    close(pass_at_k(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, k=2), [1, -1 / 3, -1 / 3, -1 / 3])
    # threshold 0.4: 0.5 is now correct, the same group
    close(pass_at_k(torch.tensor([0.5, 0.0, 0.0, 0.0]), 4, k=2, threshold=0.4), [1, -1 / 3, -1 / 3, -1 / 3])


def test_pass_at_k_edge_cases_of_k():
    one_right = torch.tensor([1.0, 0.0, 0.0, 0.0])
    # k=1: R = 1/4, sigma = sqrt(3)/4, A_pos = (3/4)/sigma = sqrt(3), A_neg = (3/4 - 1)/sigma = -1/sqrt(3):
    # GRPO's (r - mean) / population std
    r3 = math.sqrt(3)
    close(pass_at_k(one_right, 4, k=1), [r3, -1 / r3, -1 / r3, -1 / r3])
    # k=3: R = 1 - C(3,3)/C(4,3) = 3/4, sigma = sqrt(3)/4, A_pos = (1/4)/sigma = 1/sqrt(3),
    # A_neg = (1/4 - C(2,2)/C(3,2))/sigma = (-1/12) * 4/sqrt(3) = -1/(3 sqrt(3))
    close(pass_at_k(one_right, 4, k=3), [1 / r3, -1 / (3 * r3), -1 / (3 * r3), -1 / (3 * r3)])
    # k=G=4: every 4-subset is the whole group, R = 1: no signal
    close(pass_at_k(one_right, 4, k=4), [0, 0, 0, 0])
    # k=3 with two wrong: N_neg = 2 < k, every 3-subset holds a right one, R = 1: no signal
    close(pass_at_k(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4, k=3), [0, 0, 0, 0])
    with pytest.raises(ValueError, match="1 <= k <= the group size 4"):
        pass_at_k(one_right, 4, k=5)


OURS = [name for name, registered in ESTIMATORS.items() if registered.function is not None]


@pytest.mark.parametrize("name", OURS)
def test_every_estimator_gives_a_group_without_spread_zero(name):
    close(estimate(name, torch.tensor([0.3, 0.3, 0.3, 0.7, 0.7, 0.7]), 3), [0] * 6)


def test_an_unscorable_completion_is_left_out_of_the_statistics_and_gets_zero_as_in_trl():
    # [1, NaN, 0, 0]: three scorable, mean 1/3
    rewards = torch.tensor([1.0, NAN, 0.0, 0.0])
    close(dr_grpo(rewards, 4), [2 / 3, 0, -1 / 3, -1 / 3])
    close(rloo(rewards, 4), [1, 0, -0.5, -0.5])  # 1 - (0+0)/2; 0 - (1+0)/2
    # centred 2/3, -1/3, -1/3 (mean 0), unbiased variance (4/9 + 1/9 + 1/9) / 2 = 1/3
    scale = math.sqrt(1 / 3 + 1e-8)
    close(reinforce_pp_baseline(rewards, 4), [2 / 3 / scale, 0, -1 / 3 / scale, -1 / 3 / scale])
    # N=3 scorable, k=2: R = 1 - C(2,2)/C(3,2) = 2/3, sigma = sqrt(2)/3, A_pos = (1/3)/sigma = 1/sqrt(2),
    # A_neg = (1/3 - C(1,1)/C(2,1))/sigma = (-1/6) * 3/sqrt(2) = -1/(2 sqrt(2))
    r2 = math.sqrt(2)
    close(pass_at_k(rewards, 4, k=2), [1 / r2, 0, -1 / (2 * r2), -1 / (2 * r2)])
    # G=2: a group that nothing scored gets 0 and leaves the other group's values as they are alone (pass@2 of
    # [1, 0] is 1 whichever pair is drawn: sigma = 0)
    half = 0.5 / math.sqrt(0.5 + 1e-8)  # centred 0.5, -0.5: unbiased variance 0.5
    alone = {"dr_grpo": [0.5, -0.5], "rloo": [1, -1], "reinforce_pp_baseline": [half, -half], "pass_at_k": [0, 0]}
    for name in alone:
        settings = {"k": 2} if name == "pass_at_k" else {}
        close(estimate(name, torch.tensor([NAN, NAN, 1.0, 0.0]), 2, **settings), [0, 0, *alone[name]])
    # fewer than k scored: 0
    close(pass_at_k(torch.tensor([1.0, NAN, NAN, 0.0]), 4, k=3), [0, 0, 0, 0])


def test_dr_grpo_is_trls_advantage_without_std_scaling():
    """TRL 1.16 with scale_rewards=none: rewards - the group's nanmean (its code, spelled out)."""
    rewards = torch.tensor([0.2, 0.9, NAN, 0.4, 1.0, 1.0, 0.0, 0.3])
    mean = torch.nanmean(rewards.view(-1, 4), dim=1).repeat_interleave(4)
    assert torch.equal(dr_grpo(rewards, 4), torch.nan_to_num(rewards - mean, nan=0.0))


# ---- the config's rules ---------------------------------------------------------------------------------------------


def test_the_default_is_grpo_and_every_registered_estimator_has_its_option():
    assert compose_config().algorithm.name == TRL_ADVANTAGES == "grpo"
    assert ESTIMATORS[TRL_ADVANTAGES].function is None, "grpo is TRL's own computation"
    assert sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")) == sorted(ESTIMATORS)
    for name, registered in ESTIMATORS.items():
        algorithm = compose_config([f"algorithm={name}"]).algorithm
        # The option is the estimator with its settings at their defaults (the function's keyword defaults).
        assert dict(algorithm) == {"name": name, **registered.settings}


def test_pass_at_k_declares_its_settings_as_keyword_parameters():
    assert ESTIMATORS["pass_at_k"].settings == {"k": 2, "threshold": 0.5}
    assert ESTIMATORS["rloo"].settings == {}


def test_an_unknown_algorithm_lists_the_options():
    with pytest.raises(MissingConfigException) as err:
        compose_config(["algorithm=unknown"])
    assert "rloo" in str(err.value) and "pass_at_k" in str(err.value)
    with pytest.raises(UserError) as err:
        resolve(compose_config([*TINY_RUN, "logger=none", "algorithm.name=unknown"]), processes=1)
    assert str(err.value).startswith("algorithm.name=unknown: no such estimator") and "reinforce_pp_baseline" in str(
        err.value
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm=pass_at_k", "algorithm.k=3"],  # trainer=debug: G=2
            "algorithm=pass_at_k algorithm.k=3 algorithm.threshold=0.5 with trainer.num_generations=2: "
            "pass@k needs 1 <= k <= the group size 2, not k=3",
        ),
        (["algorithm=pass_at_k", "algorithm.k=0"], "pass@k needs 1 <= k <= the group size 2, not k=0"),
        (
            ["algorithm=rloo", "trainer.scale_rewards=batch"],
            "trainer.scale_rewards=batch is TRL's scaling of its advantages, which algorithm=rloo replaces",
        ),
        (
            ["algorithm=dr_grpo", "trainer.scale_rewards=none"],
            "trainer.scale_rewards=none is TRL's scaling of its advantages, which algorithm=dr_grpo replaces",
        ),
        (
            ["algorithm=pass_at_k", "+trainer.extra.multi_objective_aggregation=normalize_then_sum"],
            "trainer.extra.multi_objective_aggregation=normalize_then_sum is TRL's own advantage estimator",
        ),
        (["algorithm=rloo", "+algorithm.k=3"], "algorithm.k=3: algorithm=rloo has no setting 'k' (its settings: none)"),
        (["+algorithm.threshold=0.9"], "algorithm.threshold=0.9: algorithm=grpo has no setting 'threshold'"),
        (["algorithm=pass_at_k", "algorithm.threshold=nan"], "algorithm.threshold=nan"),  # not a finite number
        (
            ["algorithm=pass_at_k", "algorithm.k=two"],
            "algorithm.k='two': algorithm=pass_at_k takes int for k (default 2)",
        ),
    ],
)
def test_a_bad_algorithm_setting_fails_naming_the_keys(overrides, message):
    cfg = compose_config([*TINY_RUN, "logger=none", *overrides])
    with pytest.raises(UserError) as err:
        resolve(cfg, processes=1)
    assert message in str(err.value)


SCALED_SELFVERIFY = [
    "reward=math+selfverify",
    "trainer.prompts_per_step=3",
    "reward.components.selfverify.scale_by_pass_rate=true",
]


@pytest.mark.parametrize("algorithm", ["dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_pass_rate_scaling_is_accepted_by_the_estimators_that_keep_a_groups_scale(algorithm):
    # No division by the group's own std: a group's constant factor survives into its advantages.
    spec = resolve(
        compose_config([*TINY_RUN, "logger=none", *SCALED_SELFVERIFY, f"algorithm={algorithm}"]), processes=1
    )
    assert spec.components["selfverify"].scale_by_pass_rate
    # Two groups alike but for their pass-rate factors 0.25 and 0.5: the second's advantages are twice the first's.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]) * torch.tensor([0.25] * 4 + [0.5] * 4)
    advantages = estimate(algorithm, rewards, 4)
    assert torch.allclose(advantages[4:], 2 * advantages[:4])
    assert advantages[0] > 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "trainer.scale_rewards=group divides out again"),  # algorithm=grpo, TRL's group scaling
        (["algorithm=pass_at_k"], "which algorithm=pass_at_k cancels"),
    ],
)
def test_pass_rate_scaling_is_refused_where_the_advantage_cancels_it(overrides, message):
    with pytest.raises(UserError) as err:
        resolve(compose_config([*TINY_RUN, "logger=none", *SCALED_SELFVERIFY, *overrides]), processes=1)
    assert message in str(err.value) and "reward.components.selfverify.scale_by_pass_rate=true" in str(err.value)


def test_the_estimator_reaches_the_trainers_config():
    cfg = compose_config(
        [*TINY_RUN, "logger=none", "trainer.num_generations=4", "algorithm=pass_at_k", "algorithm.k=3"]
    )
    args = resolve(cfg, processes=1, trainer_dir=Path("unused")).args
    assert (args.advantage_estimator, args.advantage_settings) == ("pass_at_k", {"k": 3, "threshold": 0.5})
    default = resolve(compose_config([*TINY_RUN, "logger=none"]), processes=1, trainer_dir=Path("unused")).args
    assert (default.advantage_estimator, default.advantage_settings) == ("grpo", {})


# ---- training: TRL's own GRPOTrainer really trains -------------------------------------------------------------------


def odd_length(completions, **kwargs):
    """1 for a completion of odd length, else 0: right and wrong answers in most groups, whatever the model says."""
    return [float(len(c[-1]["content"]) % 2) for c in completions]


def train(trainer_class, tmp_path: Path, model_dir: Path, overrides: list[str], steps: int):
    cfg = compose_config(
        [
            *TINY_RUN,
            "logger=none",
            "trainer.num_generations=4",
            f"trainer.max_steps={steps}",
            *knob_overrides(PLAIN_TRL),
            *overrides,
        ]
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[odd_length],
        args=grpo_exp_config(cfg.trainer, tmp_path / "trainer", "none", [1.0], False, algorithm=cfg.algorithm),
        train_dataset=load_splits(cfg.dataset)[0],
        processing_class=load_tokenizer(cfg.model, cfg.cache_dir),
    )
    trainer.train()
    return trainer


def test_the_default_algorithm_trains_as_trl_to_the_bit(tmp_path, tiny_model_dir):
    """algorithm=grpo through the seam and TRL's own GRPOTrainer, from the same weights and seed: the same losses,
    gradient norms and rewards, and the same weights after the step (the advantages are TRL's, recomputed nowhere).
    TRL's scores the positions the seam does: on CPU the seam scores only the labelled ones, as TRL does on CUDA (to
    float rounding what TRL's CPU path gives: tests/test_lm_head_positions.py)."""
    ours = train(Recording, tmp_path / "ours", tiny_model_dir, [], steps=1)
    assert ours.args.advantage_estimator == TRL_ADVANTAGES
    with labelled_positions_only():
        theirs = train(GRPOTrainer, tmp_path / "trl", tiny_model_dir, [], steps=1)
    (batch,) = ours.batches
    assert batch.grouped(batch.advantages).abs().sum() > 0  # the step had something to learn from
    keys = ("loss", "grad_norm", "reward", "reward_std")
    assert [[s.get(k) for k in keys] for s in ours.state.log_history[:1]] == [
        [s.get(k) for k in keys] for s in theirs.state.log_history[:1]
    ]
    trl_weights = dict(theirs.model.named_parameters())
    for name, weight in ours.model.named_parameters():
        assert torch.equal(weight, trl_weights[name]), name


@pytest.mark.parametrize(
    "overrides",
    [["algorithm=reinforce_pp_baseline"], ["algorithm=pass_at_k", "algorithm.k=2", "algorithm.threshold=0.5"]],
    ids=["reinforce_pp_baseline", "pass_at_k"],
)
def test_a_non_default_estimator_is_what_trl_trains_with(tmp_path, tiny_model_dir, overrides):
    """Two real steps: the advantages of every scored batch (TRL's logs, which the group statistics read) are the
    estimator on the rewards TRL logged, and TRL's loss is the one of those advantages (at the first of one iteration,
    PPO's ratio is 1: the dapo loss is -sum(A_i * tokens_i) / sum(tokens_i))."""
    trainer = train(Recording, tmp_path, tiny_model_dir, overrides, steps=2)
    name, settings = trainer.args.advantage_estimator, trainer.args.advantage_settings
    assert name == compose_config(overrides).algorithm.name and len(trainer.batches) == 2
    steps = [step for step in trainer.state.log_history if "loss" in step]
    for batch, step in zip(trainer.batches, steps, strict=True):
        expected = estimate(name, batch.total, 4, **settings)
        assert torch.equal(batch.advantages, expected)
        loss = -(batch.advantages * batch.lengths).sum() / batch.lengths.sum()
        assert step["loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert any(batch.advantages.abs().sum() > 0 for batch in trainer.batches)  # they had something to learn from
    # The batch TRL trains on carries them too (this process's rows: all of them, in one process).
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    output = trainer.generate_and_score([trainer.train_dataset[i] for i in range(2) for _ in range(4)])
    batch = trainer.batches[-1]
    assert torch.equal(output["advantages"].cpu(), batch.advantages)
    assert torch.equal(batch.advantages, estimate(name, batch.total, 4, **settings))
