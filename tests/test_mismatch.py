"""The sampler/trainer mismatch (trainer.mismatch_*, grpo_exp.trainer.mismatch): its metrics and TRL's corrections by
hand, the corrected loss against TRL's own code, every generation path measured in a real tiny run, and the rules."""

import math

import pytest
import torch

from grpo_exp.errors import UserError
from grpo_exp.schema import MismatchCorrection
from grpo_exp.trainer.config import check_trainer
from grpo_exp.trainer.mismatch import check_mismatch, vllm_fields
from grpo_exp.trainer.mismatch_stats import (
    importance_weights,
    mismatch_metrics,
    mismatch_sums,
    off_policy_metrics,
    off_policy_sums,
    reference_metrics,
    reference_sums,
    weighted_advantages,
)
from grpo_exp.trainer.prepacked_linear import can_prepack
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import logged_steps, run_cli
from tests.helpers.tiny_trainer import G, generation_batch, make_trainer

C = MismatchCorrection
LOG = math.log


def by_index(completions, **kwargs):
    return [float(i % G) for i in range(len(completions))]


# Two completions of two tokens. Row 0: the trainer gives its tokens 0.5 and 0.2, the sampler 0.25 and 0.4 (ratios 2
# and 0.5). Row 1: 0.4 against 0.1 (ratio 4), then a padding token (masked).
TRAINER = torch.tensor([[LOG(0.5), LOG(0.2)], [LOG(0.4), LOG(0.3)]])
SAMPLER = torch.tensor([[LOG(0.25), LOG(0.4)], [LOG(0.1), LOG(0.9)]])
MASK = torch.tensor([[1, 1], [1, 0]])


@pytest.mark.parametrize(
    ("correction", "expected"),
    [
        # each token's ratio clamped to [0.6, 3]; a masked token weighs 1 (its difference counts as 0)
        (C.token_truncate, [[2.0, 0.6], [3.0, 1.0]]),
        # ...or zeroed outside it
        (C.token_mask, [[2.0, 0.0], [0.0, 1.0]]),
        # each sequence's ratio (product over its counted tokens): 2 x 0.5 = 1 and 4, clamped
        (C.sequence_truncate, [[1.0], [3.0]]),
        (C.sequence_mask, [[1.0], [0.0]]),
    ],
)
def test_trls_importance_weights_by_hand(correction, expected):
    weights = importance_weights(TRAINER, SAMPLER, MASK, correction, 0.6, 3.0)
    torch.testing.assert_close(weights, torch.tensor(expected), atol=1e-6, rtol=0)


def test_weights_without_bounds_and_with_an_unknown_sampler_log_probability():
    sampler = SAMPLER.clone()
    sampler[0, 0] = math.nan  # vLLM could not score it: the trainer's own (ratio 1), as in TRL
    weights = importance_weights(TRAINER, sampler, MASK, C.token_mask, None, None)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.5], [4.0, 1.0]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="not a weighting correction"):
        importance_weights(TRAINER, SAMPLER, MASK, C.behaviour_ratio, None, None)


def test_the_metrics_by_hand_over_two_processes():
    """Process 1 counts 3 tokens: |log ratio| log 2, log 2 (0.5), log 4. Process 2: one token, ratio 1. Over the 4
    tokens: mean |difference| (2 log 2 + log 4) / 4 = log 2; k3 = r - 1 - log r: (1 - log 2) + (-0.5 + log 2) +
    (3 - log 4) + 0 = 3.5 - 2 log 2, over 4."""
    first = mismatch_sums(TRAINER, SAMPLER, MASK, None)
    second = mismatch_sums(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[1]]), None)
    metrics = mismatch_metrics(torch.stack([first, second]))
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(LOG(2))
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(LOG(4))
    assert metrics["sampling/mismatch_kl"] == pytest.approx((3.5 - 2 * LOG(2)) / 4)
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(0.5)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx((2 + 0.5 + 4 + 1) / 4)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(4.0)
    # with a correction, the ratios are the weights the loss applies (per sequence: one per sequence)
    weights = importance_weights(TRAINER, SAMPLER, MASK, C.sequence_truncate, 0.6, 3.0)
    corrected = mismatch_metrics(mismatch_sums(TRAINER, SAMPLER, MASK, weights)[None])
    assert corrected["sampling/importance_sampling_ratio/mean"] == pytest.approx((1 + 3) / 2)
    assert corrected["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    assert mismatch_metrics(mismatch_sums(TRAINER, SAMPLER, torch.zeros_like(MASK), None)[None]) == {}


def test_how_off_policy_a_batch_is_by_hand_over_two_processes():
    """Token ratios 2, 0.5, 4 (process 1) and 1 (process 2): ESS (7.5)^2 / (4 x 21.25) = 0.662; with bounds [0.6, 3],
    0.5 and 4 are outside: half the tokens. Per sequence (row ratios 1 and 4, and 1): (6)^2 / (3 x 18), one of three
    outside. On-policy the ESS is 1 and nothing is outside."""
    second = off_policy_sums(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[1]]), False, (0.6, 3.0))
    tokens = off_policy_metrics(torch.stack([off_policy_sums(TRAINER, SAMPLER, MASK, False, (0.6, 3.0)), second]), True)
    assert tokens["sampling/importance_sampling_ess_fraction"] == pytest.approx(7.5**2 / (4 * 21.25))
    assert tokens["sampling/importance_sampling_clipped_fraction"] == pytest.approx(0.5)
    second = off_policy_sums(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[1]]), True, (0.6, 3.0))
    first = off_policy_sums(TRAINER, SAMPLER, MASK, True, (0.6, 3.0))
    sequences = off_policy_metrics(torch.stack([first, second]), True)
    assert sequences["sampling/importance_sampling_ess_fraction"] == pytest.approx(36 / (3 * 18))
    assert sequences["sampling/importance_sampling_clipped_fraction"] == pytest.approx(1 / 3)
    # no correction: the ESS only; an unknown sampler log-probability is not counted
    sampler = SAMPLER.clone()
    sampler[1, 0] = math.nan
    alone = off_policy_metrics(off_policy_sums(TRAINER, sampler, MASK, False, None)[None], False)
    assert alone == {"sampling/importance_sampling_ess_fraction": pytest.approx(2.5**2 / (2 * 4.25))}
    on_policy = off_policy_metrics(off_policy_sums(TRAINER, TRAINER, MASK, True, (0.6, 3.0))[None], True)
    assert on_policy == {
        "sampling/importance_sampling_ess_fraction": pytest.approx(1.0),
        "sampling/importance_sampling_clipped_fraction": 0.0,
    }
    # a sequence far off-policy (a log-ratio of 1,200) does not overflow: beside one on-policy sequence it carries all
    # the weight, an ESS of one sequence in two, not NaN
    far = off_policy_sums(torch.tensor([[0.0] * 40]), torch.tensor([[-30.0] * 40]), torch.ones(1, 40), True, None)
    assert off_policy_metrics(torch.stack([far, second]), False)["sampling/importance_sampling_ess_fraction"] == 0.5
    assert off_policy_metrics(off_policy_sums(TRAINER, SAMPLER, torch.zeros_like(MASK), False, None)[None], False) == {}


def test_the_float64_reference_separates_the_sampler_from_the_trainer_by_hand():
    exact = torch.tensor([[-1.0, -2.0]])
    sampler, trainer = torch.tensor([[-1.1, -2.0]]), torch.tensor([[-1.0, -2.3]])
    metrics = reference_metrics(reference_sums(trainer, sampler, exact, torch.tensor([[1, 1]]))[None])
    assert metrics["sampling/float64/sampler_logp_difference/mean"] == pytest.approx(0.05)
    assert metrics["sampling/float64/trainer_logp_difference/mean"] == pytest.approx(0.15)
    assert metrics["sampling/float64/trainer_logp_difference/max"] == pytest.approx(0.3)


def test_the_corrected_loss_by_hand(tmp_path):
    """On-policy (old log-probabilities = the new ones) every PPO ratio is 1, so dapo's loss is -sum_t w_t A_t / N
    over the N counted tokens, whatever the model: the weights reach the loss through the advantages."""
    trainer = make_trainer(tmp_path, by_index, prompts=2, overrides=["trainer.loss_type=dapo"])
    batch = generation_batch(trainer, prompts=2)
    batch.pop("old_per_token_logps", None)
    mask = batch["completion_mask"].float()
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.5, 0.0, 1.5, -2.0])
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) * 2
    batch["importance_sampling_ratio"] = weights
    batch["num_items_in_batch"] = mask.sum()
    expected = -(weights * batch["advantages"][:, None] * mask).sum() / mask.sum()
    torch.testing.assert_close(trainer.compute_loss(trainer.model, batch), expected, atol=1e-5, rtol=1e-5)


def test_weighting_the_advantages_is_trls_own_weighted_loss(tmp_path):
    """TRL applies the weights (on vLLM) by multiplying each token's policy loss; the seam multiplies the advantages.
    Off-policy ratios (old log-probabilities shifted) so that PPO's clip acts: same loss and gradient as TRL's own
    code with its vLLM correction switched on, for each of TRL's loss types (one trainer, its loss type switched)."""
    trainer = make_trainer(tmp_path, by_index, prompts=2)
    batch = generation_batch(trainer, prompts=2)
    with torch.no_grad():
        new = trainer.trainer_log_probs(batch)
    shift = torch.linspace(-0.4, 0.4, new.numel()).view_as(new)
    batch["old_per_token_logps"] = new + shift
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.5, 0.1, 1.5, -2.0])
    batch["importance_sampling_ratio"] = torch.linspace(0.0, 2.0, new.numel()).view_as(new)

    def loss_and_gradient(compute) -> tuple[torch.Tensor, torch.Tensor]:
        trainer.model.zero_grad(set_to_none=True)
        loss = compute(trainer.model, dict(batch))
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters()])

    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo"):
        trainer.loss_type = loss_type
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = trainer.mismatch.stands_aside = False
        ours = loss_and_gradient(trainer.compute_loss)
        # TRL's own code applies them (its vLLM path), the seam standing aside as it does there
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = trainer.mismatch.stands_aside = True
        trls = loss_and_gradient(trainer.compute_loss)
        torch.testing.assert_close(ours[0], trls[0], atol=1e-6, rtol=1e-5, msg=loss_type)
        torch.testing.assert_close(ours[1], trls[1], atol=1e-6, rtol=1e-4, msg=loss_type)


def test_weighted_advantages_broadcast_per_token_and_per_sequence():
    advantages = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(
        weighted_advantages(advantages, torch.tensor([[0.5, 1.0], [2.0, 0.0]])), torch.tensor([[0.5, 1.0], [-4.0, 0.0]])
    )
    torch.testing.assert_close(
        weighted_advantages(advantages, torch.tensor([[3.0], [0.0]])), torch.tensor([[3.0], [0.0]])
    )


def test_the_behaviour_ratio_makes_the_samplers_log_probabilities_ppos_old_ones(tmp_path):
    trainer = make_trainer(
        tmp_path,
        by_index,
        prompts=2,
        bfloat16_generation=True,
        mismatch_metrics=True,
        mismatch_correction="behaviour_ratio",
    )
    batch = generation_batch(trainer, prompts=2)
    torch.testing.assert_close(batch["old_per_token_logps"], batch["sampling_per_token_logps"])
    assert "importance_sampling_ratio" not in batch
    corrected = make_trainer(
        tmp_path, by_index, prompts=2, bfloat16_generation=True, mismatch_correction="token_truncate"
    )
    batch = generation_batch(corrected, prompts=2)
    assert "old_per_token_logps" not in batch  # TRL's own: the trainer's log-probabilities
    assert batch["importance_sampling_ratio"].shape == batch["completion_ids"].shape


# ---- every path, in a real run ---------------------------------------------------------------------------------

PATHS = {
    "generate": ["trainer.fast_generation=false", "trainer.mismatch_metrics=true", "trainer.float64_reference_every=1"],
    "float32_copy": ["trainer.fast_generation=true", "trainer.mismatch_metrics=true"],
    "bfloat16_copy": ["generation=transformers_bf16", "trainer.mismatch_correction=token_truncate"],  # auto: on
    "multiturn": [
        "rollout=multiturn",
        "rollout.tools=[calculator]",
        "trainer.mismatch_metrics=true",
        "trainer.mismatch_correction=sequence_mask",
    ],
}


@pytest.mark.e2e
@pytest.mark.parametrize("path", list(PATHS))
def test_every_generation_path_logs_the_mismatch_under_trls_names(tmp_path, path):
    if path == "float32_copy" and not can_prepack():
        pytest.skip("this torch cannot prepack float32 weights (MKL or oneDNN): no float32 copy here")
    result = run_cli(
        *TINY_RUN,
        "logger=none",
        "trainer.max_steps=2",
        "eval.before=false",
        "eval.after=false",
        *PATHS[path],
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in logged_steps(tmp_path) if "reward" in m]
    assert len(steps) == 2
    for step in steps:
        difference = step["sampling/sampling_logp_difference/mean"]
        assert 0.0 <= difference <= step["sampling/sampling_logp_difference/max"]
        assert step["sampling/importance_sampling_ratio/min"] <= step["sampling/importance_sampling_ratio/max"]
        assert step["sampling/mismatch_kl"] >= 0.0
        assert 0.0 < step["sampling/importance_sampling_ess_fraction"] <= 1.0 + 1e-9
        if path == "bfloat16_copy":  # rounded weights: a difference beyond float32's, truncated at 3
            assert 1e-5 < difference < 0.1 and step["sampling/importance_sampling_ratio/max"] <= 3.0
        else:  # the policy's own distribution, up to the rounding of another summation order
            assert difference < 1e-4
    if path == "generate":
        step = steps[0]
        assert step["sampling/float64/sampler_logp_difference/mean"] < 1e-4
        assert step["sampling/float64/trainer_logp_difference/mean"] < 1e-4


# ---- the rules ---------------------------------------------------------------------------------------------------


def trainer_cfg(*overrides):
    return compose_config([*TINY_RUN, *overrides]).trainer


def check(cfg, **path):
    defaults = {"use_vllm": False, "use_transformers_paged": False, "sharded": False, "loss_type": "dapo"}
    check_mismatch(cfg, **(defaults | path))


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        (["trainer.mismatch_metrics=true"], {"use_transformers_paged": True}, "trainer.mismatch_metrics=true needs"),
        (
            ["trainer.mismatch_correction=token_mask"],
            {"use_transformers_paged": True},
            "mismatch_correction=token_mask",
        ),
        (["trainer.float64_reference_every=5"], {"sharded": True}, "not under DeepSpeed or FSDP"),
        (["trainer.mismatch_clip_min=2.0", "trainer.mismatch_clip_max=1.0"], {}, "mismatch_clip_min=2.0 is above"),
        (["trainer.mismatch_correction=behaviour_ratio"], {"use_vllm": True}, "TRL's own correction serves"),
        (
            ["trainer.mismatch_correction=token_mask", "+trainer.extra.vllm_importance_sampling_mode=token_mask"],
            {"use_vllm": True},
            "not both",
        ),
        (["trainer.mismatch_correction=sequence_mask"], {"loss_type": "vespo"}, "token-level weights only"),
    ],
)
def test_settings_the_path_cannot_honour_are_refused_naming_the_keys(overrides, path, message):
    with pytest.raises(UserError, match=message):
        check(trainer_cfg(*overrides), **path)


def test_paged_generation_runs_unmeasured_by_default_and_vllm_takes_the_correction_as_trls_own():
    check(trainer_cfg(), use_transformers_paged=True)  # auto: nothing asked that it cannot give
    cfg = trainer_cfg("trainer.mismatch_correction=token_truncate", "trainer.mismatch_clip_min=0.5")
    assert vllm_fields(cfg) == {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_min": 0.5,
        "vllm_importance_sampling_clip_max": 3.0,
    }
    assert vllm_fields(trainer_cfg("trainer.mismatch_correction=none")) == {
        "vllm_importance_sampling_correction": False
    }
    assert vllm_fields(trainer_cfg()) == {}  # TRL's own defaults


def test_generation_ahead_corrects_each_token_truncated_unless_told_otherwise():
    """Staleness 1 ended closest to synchronous under token truncation (BENCHMARKS.md): generation ahead's default.
    Staleness 0 keeps the synchronous path's (TRL's), so that it stays the synchronous run exactly."""
    ahead = ["generation=vllm_async"]
    assert vllm_fields(trainer_cfg(*ahead))["vllm_importance_sampling_mode"] == "token_truncate"
    assert vllm_fields(trainer_cfg(*ahead, "trainer.max_staleness=0")) == {}
    assert (
        vllm_fields(trainer_cfg(*ahead, "trainer.mismatch_correction=sequence_mask"))["vllm_importance_sampling_mode"]
        == "sequence_mask"
    )
    assert vllm_fields(trainer_cfg(*ahead, "+trainer.extra.vllm_importance_sampling_mode=sequence_mask")) == {}


def test_the_rules_run_with_the_trainers_before_any_model_loads():
    cfg = trainer_cfg("trainer.mismatch_correction=sequence_truncate", "trainer.loss_type=vespo")
    with pytest.raises(UserError, match="vespo"):
        check_trainer(cfg, 1, multiturn=False, policy_dtype=torch.float32)
