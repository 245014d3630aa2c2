"""The user's own advantage estimator (algorithm.name=module:name) and policy loss (trainer.loss_type=module:name):
registered beside the built-ins, checked before any model loads (each mistake one message naming the key), what
TRL really trains with, and end to end from a project directory outside the repository."""

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_exp.errors import UserError
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from grpo_exp.trainer.advantages import ESTIMATORS, estimate, register_estimator
from grpo_exp.trainer.losses import TRL_LOSS_TYPES, policy_loss  # noqa: F401 - the seam delegates to it
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_command
from tests.helpers.tiny_trainer import PLAIN_TRL, knob_overrides, logged, make_trainer

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")

ESTIMATORS_PY = '''
import torch

def sign(rewards, group_size, scale=1.0):
    """scale * the sign of (reward - its group's mean)."""
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.nanmean(dim=1, keepdim=True)
    return (scale * torch.sign(torch.nan_to_num(centred))).view(-1)

def one_argument(rewards):
    return rewards

def too_short(rewards, group_size):
    return rewards[:-1]

def raises(rewards, group_size):
    raise RuntimeError("no baseline today")

def nan(rewards, group_size):
    return rewards * float("nan")

not_a_function = 3
'''

LOSSES_PY = '''
import torch

def clipped(per_token_logps, old_per_token_logps, advantages, completion_mask, epsilon_low, epsilon_high, **kwargs):
    """PPO's clipped term per token, as TRL's dapo computes it."""
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    a = advantages.unsqueeze(1)
    return -torch.min(ratio * a, clipped * a), {"mean_ratio": ratio.mean()}

def no_kwargs(per_token_logps, old_per_token_logps, advantages, completion_mask):
    return per_token_logps

def per_sequence(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    return per_token_logps.sum(dim=1)

def raises(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    raise ValueError("bad day")

def constant(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    return torch.ones_like(per_token_logps)

def entropy_like(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    return -advantages.unsqueeze(1) * per_token_logps + 0.01 * per_token_logps
'''


@pytest.fixture
def project(tmp_path, monkeypatch) -> dict[str, str]:
    """A user's modules in a directory of their own (the current directory, as when they run grpo-exp there), under
    names unique to the test (Python keeps an imported module)."""
    names = {"est": f"my_est_{uuid.uuid4().hex[:8]}", "loss": f"my_loss_{uuid.uuid4().hex[:8]}"}
    (tmp_path / f"{names['est']}.py").write_text(ESTIMATORS_PY)
    (tmp_path / f"{names['loss']}.py").write_text(LOSSES_PY)
    monkeypatch.chdir(tmp_path)
    return names


def refused(overrides: list[str]) -> str:
    with pytest.raises(UserError) as err:
        resolve(compose_config([*TINY_RUN, "logger=none", *overrides]), processes=1, trainer_dir=Path("unused"))
    return str(err.value)


# ---- the registry ------------------------------------------------------------------------------------------------


def test_a_registered_estimator_is_one_function_with_its_settings_by_name():
    @register_estimator("halved_for_test")
    def halved(rewards: torch.Tensor, group_size: int, factor: float = 0.5) -> torch.Tensor:
        return factor * (rewards - rewards.view(-1, group_size).mean(dim=1).repeat_interleave(group_size))

    try:
        assert ESTIMATORS["halved_for_test"].settings == {"factor": 0.5}
        # group means 0.5 and 2: (1 - 0.5)/2, (0 - 0.5)/2, (3 - 2)/2, (1 - 2)/2
        result = estimate("halved_for_test", torch.tensor([1.0, 0.0, 3.0, 1.0]), 2)
        assert result.tolist() == [0.25, -0.25, 0.5, -0.5]
        assert estimate("halved_for_test", torch.tensor([1.0, 0.0]), 2, factor=2.0).tolist() == [1.0, -1.0]
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("halved_for_test")(halved)
    finally:
        del ESTIMATORS["halved_for_test"]


def test_a_users_estimator_by_import_path_with_its_settings(project):
    name = f"{project['est']}:sign"
    # [1, 0, 0, 1] mean 0.5: signs +-1; [0.2, 0.2, 0.2, 0.8] mean 0.35: -, -, -, +
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.2, 0.2, 0.8])
    assert estimate(name, rewards, 4).tolist() == [1, -1, -1, 1, -1, -1, -1, 1]
    assert estimate(name, rewards, 4, scale=0.5).tolist() == [0.5, -0.5, -0.5, 0.5, -0.5, -0.5, -0.5, 0.5]
    spec = resolve(
        compose_config([*TINY_RUN, "logger=none", f"algorithm.name={name}", "+algorithm.scale=0.5"]),
        processes=1,
        trainer_dir=Path("unused"),
    )
    assert (spec.args.advantage_estimator, spec.args.advantage_settings) == (name, {"scale": 0.5})


def test_trls_loss_types_pass_straight_through_and_a_users_loss_gets_dapos_aggregation(project):
    for loss_type in TRL_LOSS_TYPES[:4]:
        args = resolve(
            compose_config([*TINY_RUN, "logger=none", f"trainer.loss_type={loss_type}"]),
            processes=1,
            trainer_dir=Path("unused"),
        ).args
        assert (args.loss_type, args.policy_loss) == (loss_type, None)
    name = f"{project['loss']}:clipped"
    args = resolve(
        compose_config([*TINY_RUN, "logger=none", f"trainer.loss_type={name}"]), processes=1, trainer_dir=Path("x")
    ).args
    assert (args.loss_type, args.policy_loss) == ("dapo", name)


# ---- checked before any model loads: one message naming the key ----------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.name=nope", "algorithm.name=nope: no such estimator; the registered ones: grpo, dr_grpo"),
        ("algorithm.name=missing_module_xyz:f", "algorithm.name=missing_module_xyz:f: module 'missing_module_xyz' not"),
        ("algorithm.name={est}:nothing", "algorithm.name={est}:nothing: module '{est}' has no attribute 'nothing'"),
        ("algorithm.name={est}:not_a_function", "algorithm.name={est}:not_a_function: not callable"),
        ("algorithm.name={est}:one_argument", "algorithm.name={est}:one_argument: cannot be called as an estimator"),
        ("algorithm.name={est}:too_short", "returned a torch.float32 tensor of shape (3,) for rewards of shape (4,)"),
        ("algorithm.name={est}:raises", "with trainer.num_generations=2: raised RuntimeError: no baseline today"),
        ("algorithm.name={est}:nan", "algorithm.name={est}:nan returned advantages that are not finite"),
        ("trainer.loss_type=nope", "trainer.loss_type=nope: no such loss; TRL's: grpo, dapo"),
        (
            "trainer.loss_type=missing_module_xyz:f",
            "trainer.loss_type=missing_module_xyz:f: module 'missing_module_xyz'",
        ),
        ("trainer.loss_type={loss}:no_kwargs", "trainer.loss_type={loss}:no_kwargs: must accept **kwargs"),
        ("trainer.loss_type={loss}:per_sequence", "returned a torch.float32 tensor of shape (4,) for per_token_logps"),
        ("trainer.loss_type={loss}:raises", "trainer.loss_type={loss}:raises raised ValueError: bad day"),
        ("trainer.loss_type={loss}:constant", "its loss does not depend on per_token_logps"),
        ("trainer.loss_type={loss}:entropy_like", "a completion whose advantage is 0 gets a non-zero loss"),
    ],
)
def test_a_users_mistake_is_refused_with_one_message_naming_the_key(project, override, message):
    text = refused([override.format(**project), "trainer.zero_variance_groups=skip"])
    assert message.format(**project) in text, text
    assert "\n" not in text


def test_a_loss_that_is_not_zero_at_zero_advantage_trains_with_keep(project):
    cfg = [f"trainer.loss_type={project['loss']}:entropy_like", "trainer.zero_variance_groups=keep"]
    assert resolve(compose_config([*TINY_RUN, "logger=none", *cfg]), processes=1).cfg.trainer.loss_type


def test_trls_own_loss_knobs_are_refused_with_a_users_loss(project):
    text = refused([f"trainer.loss_type={project['loss']}:clipped", "+trainer.extra.top_entropy_quantile=0.5"])
    assert "trainer.extra.top_entropy_quantile=0.5 acts inside TRL's own loss" in text


def test_a_users_estimator_takes_only_its_own_settings(project):
    text = refused([f"algorithm.name={project['est']}:sign", "+algorithm.scael=2"])
    assert f"algorithm.scael=2: algorithm={project['est']}:sign has no setting 'scael' (its settings: scale)" in text
    text = refused([f"algorithm.name={project['est']}:sign", "+algorithm.scale=big"])
    assert "algorithm.scale='big'" in text and "takes float" in text


# ---- what TRL trains with --------------------------------------------------------------------------------------


def odd_length(completions, **kwargs):
    return [float(len(c[-1]["content"]) % 2) for c in completions]


def test_a_users_loss_that_is_dapos_term_trains_as_trls_dapo(project, tmp_path):
    """The user's clipped term, aggregated by grpo_exp as dapo is, with TRL's KL term (beta > 0): two steps give TRL's
    own dapo losses and gradient norms; the user's metric is logged."""
    runs = {}
    for loss_type in ("dapo", f"{project['loss']}:clipped"):
        overrides = [f"trainer.loss_type={loss_type}", "trainer.beta=0.04", "trainer.max_steps=2"]
        trainer = make_trainer(tmp_path / loss_type.replace(":", "_"), odd_length, overrides=overrides)
        trainer.train()
        runs[loss_type] = trainer
    ours, theirs = runs[f"{project['loss']}:clipped"], runs["dapo"]
    assert ours.args.policy_loss and theirs.args.policy_loss is None
    for key in ("loss", "grad_norm", "kl", "entropy"):
        assert logged(ours, key) == pytest.approx(logged(theirs, key), rel=1e-4, abs=1e-6), key
    assert logged(ours, "loss/mean_ratio") == pytest.approx([1.0, 1.0])  # on-policy: the ratio is 1
    assert not logged(theirs, "loss/mean_ratio")


# ---- end to end: a user's project outside the repository --------------------------------------------------------

PROJECT_ESTIMATOR = '''
import os
import torch

def sign(rewards, group_size, scale=1.0):
    """scale * the sign of (reward - its group's mean); each call noted in calls.txt."""
    with open("calls.txt", "a") as f:
        f.write(f"estimator {rewards.numel()}\\n")
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.nanmean(dim=1, keepdim=True)
    return (scale * torch.sign(torch.nan_to_num(centred))).view(-1)
'''

PROJECT_LOSS = '''
import torch

def positive_only(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs):
    """REINFORCE on the completions better than their group only, -max(A, 0) * log p per token (on-policy, plain
    REINFORCE would be dapo's gradient exactly), logging the share of tokens with a positive advantage."""
    a = advantages.unsqueeze(1).expand_as(per_token_logps)
    positive = ((a > 0).float() * completion_mask).sum() / completion_mask.sum().clamp(min=1)
    return -a.clamp(min=0) * per_token_logps, {"positive_tokens": positive}
'''


@pytest.mark.e2e
def test_a_users_estimator_and_loss_train_end_to_end_from_their_project(tmp_path):
    """grpo-exp train from a project directory outside the repository, its own estimator (configs/algorithm) and loss
    (an import path), swept against algorithm=grpo with TRL's loss: the user's functions ran (their calls, their
    metric, their advantages' values) and the weights differ from grpo's."""
    project = tmp_path / "project"
    (project / "configs" / "algorithm").mkdir(parents=True)
    (project / "sign_estimator.py").write_text(PROJECT_ESTIMATOR)
    (project / "my_losses.py").write_text(PROJECT_LOSS)
    (project / "configs" / "algorithm" / "sign.yaml").write_text(
        textwrap.dedent(
            """
            # my own estimator: scale * sign(reward - group mean)
            name: sign_estimator:sign
            scale: 0.5
            """
        )
    )
    sweep = tmp_path / "sweep"
    result = run_command(
        [
            GRPO_EXP,
            "train",
            "-m",
            "--config-dir",
            "configs",
            "algorithm=grpo,sign",
            "trainer.loss_type=dapo,my_losses:positive_only",
            *TINY_RUN,
            *knob_overrides(PLAIN_TRL),
            "reward=length",  # a reward with spread in every group (the tiny model's answers are never right)
            "trainer.max_steps=2",
            "trainer.num_generations=4",
            "logger=none",
            "eval.before=false",
            "eval.after=false",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=project,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Hydra's sweep order: algorithm outer, loss inner.
    settings = [(a, loss) for a in ("grpo", "sign") for loss in ("dapo", "my_losses:positive_only")]
    jobs = {setting: sweep / str(i) for i, setting in enumerate(settings)}
    for (algorithm, loss), run in jobs.items():
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["algorithm"] == (
            "sign_estimator:sign" if algorithm == "sign" else "grpo"
        )
        metrics = read_metrics(run / "metrics.jsonl")
        steps = [line for line in metrics if "loss" in line]
        assert len(steps) == 2
        assert all(("loss/positive_tokens" in line) == (loss != "dapo") for line in steps), (algorithm, loss)
        if algorithm == "sign":  # every advantage is 0 or +-0.5 (the estimator's, at its setting): per group 0 or 1
            ranges = [line["advantages/group_range"] for line in metrics if "advantages/group_range" in line]
            assert ranges and all(min(abs(r - v) for v in (0.0, 0.5, 1.0)) < 1e-6 for r in ranges), ranges  # 2 groups
    calls = (project / "calls.txt").read_text().splitlines()
    # each run of the estimator: one check at resolve time, then one call per training step (2 x 2 runs)
    assert len(calls) == 2 * 3, calls
    weights = {key: load_file(run / "checkpoint-final" / "model.safetensors") for key, run in jobs.items()}
    base = weights[("grpo", "dapo")]
    for key, other in weights.items():
        if key != ("grpo", "dapo"):
            assert any(not torch.equal(base[name], other[name]) for name in base), key
