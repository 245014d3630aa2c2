"""The self-verification reward: was the policy's Yes/No judgement of a sampled answer right?

Scores only the verification prompts that GRPOExpTrainer mixes into batches (task == "verify"); other
samples get None (skipped by this component). A malformed judgement (no boxed Yes/No; with
strict_verdict=false, no Yes/No word at all) earns 0.
"""

from dataclasses import dataclass

from omegaconf import MISSING, DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.rewards.components import Task, reward_component
from grpo_exp.schema import (
    SelfVerifyBalance,
    SelfVerifyObjective,
    SelfVerifySchedule,
    ShownPart,
    VerdictLossTokens,
    knob,
)
from grpo_exp.text import completion_text
from grpo_exp.verification.selfverify import parse_judgement, verification_reward


@dataclass
class SelfVerifyReward:
    weight: float = MISSING
    # joint: verification groups in every batch | interleave: a verification step every `every` steps |
    # verify_only: every step verifies (answers sampled first)
    schedule: SelfVerifySchedule = SelfVerifySchedule.joint
    every: int = knob(5, ge=1)
    fraction: float = knob(0.5, gt=0.0, le=1.0)  # joint: share of a batch's groups that are verification prompts
    show: ShownPart = ShownPart.answer
    drop_no_answer: bool = True  # filtering: no extractable answer
    drop_all_wrong: bool = True  # filtering: problems whose rollouts are all wrong
    # pairs: matched pairs, as the Learning-to-Self-Verify code does (a step with no mixed problem in the buffer
    # verifies nothing and says so) | share: yes_share of the `fraction` groups on average
    balance: SelfVerifyBalance = SelfVerifyBalance.pairs
    pairs_per_step: int = knob(1, ge=1)  # balance=pairs: matched pairs per step (2 verification groups each)
    yes_share: float = knob(0.5, ge=0.0, le=1.0)  # balance=share: share of "Yes" (correct) examples
    per_problem: int = knob(2, ge=1)  # diversity: at most this many examples per problem (distinct answers first)
    # grpo: verification prompts join the GRPO batch, rewarded for the right verdict | supervised: they do not;
    # instead the cross-entropy of the policy's P(Yes) at the verdict's first token against the label is added
    # to TRL's loss, x supervised_weight (the GenRM recipe)
    objective: SelfVerifyObjective = SelfVerifyObjective.grpo
    supervised_weight: float = knob(1.0, gt=0.0)
    # objective=grpo: the tokens of a verification completion that the loss counts. verdict: up to the end of the
    # verdict, which alone decides the reward (a completion without a verdict counts whole) | completion: all
    loss_on: VerdictLossTokens = VerdictLossTokens.verdict
    # reward x min(pass rate, 0.5), as in the paper. A constant per group: group-normalised advantages cancel
    # it, so it needs trainer.scale_rewards=none or batch under algorithm=grpo, or dr_grpo/rloo/reinforce_pp_baseline
    # (checked).
    scale_by_pass_rate: bool = False
    strict_verdict: bool = True  # true: only a \boxed{Yes}/\boxed{No} counts; false: else the first yes/no word
    buffer_size: int = knob(64, ge=1)  # recent labelled samples to draw verification prompts from
    template: str = knob(
        "You are a teacher checking a student's answer.\n\nQuestion: {question}\n\nStudent's answer: {answer}\n\n"
        "Is the student's answer correct? Answer with \\boxed{Yes} or \\boxed{No}.",
        contains=("{question}", "{answer}"),
    )


def _check_task(settings: DictConfig, cfg: DictConfig) -> None:
    from grpo_exp.verification.task import check_task

    check_task(settings, cfg.trainer, cfg.algorithm)


def _build_task(cfg: DictConfig, verifier, p_yes, seed: int):
    """grpo_exp.verification.task's SelfVerificationTask (torch and datasets: imported when a run builds it, not
    where the component is only named, as by --help and --cfg)."""
    from grpo_exp.verification.task import SelfVerificationTask

    return SelfVerificationTask(cfg, verifier, p_yes, seed)


# The verification prompts are the task's (grpo_exp.verification.task), mixed into batches by the trainer.
TASK = Task("the self-verification task", _build_task, check=_check_task)


@reward_component(
    "selfverify",
    SelfVerifyReward,
    needs=("p_yes",),  # its metrics read the P(Yes) of a verdict
    scales_group=("scale_by_pass_rate",),  # a constant per group: reward x min(pass rate, 0.5)
    task=TASK,
)
def make_selfverify_reward(scale_by_pass_rate: bool, strict_verdict: bool):
    """The task's other settings (reward.components.selfverify) drive grpo_exp.verification.task."""

    def selfverify(completions, task=None, verify_label=None, pass_rate=None, **kwargs) -> list[float | None]:
        rows = zip(
            completions,
            task or [None] * len(completions),
            verify_label or [None] * len(completions),
            pass_rate or [None] * len(completions),
            strict=True,
        )
        return [
            verification_reward(parse_judgement(completion_text(c), strict_verdict), label, rate, scale_by_pass_rate)
            if kind == "verify"
            else None
            for c, kind, label, rate in rows
        ]

    return selfverify


def _selfverify(key: str) -> str:
    return f"reward.components.selfverify.{key}"


def _sv(cfg: DictConfig) -> DictConfig:
    return cfg.reward.components.selfverify


def _joint_with(key: str, balance: SelfVerifyBalance, what: str = "") -> OnlyWith:
    """A selfverify setting that acts only in the joint schedule under one balance."""
    return OnlyWith(
        (_selfverify(key),),
        lambda cfg: _sv(cfg).schedule is SelfVerifySchedule.joint and _sv(cfg).balance is balance,
        f"by schedule=joint with balance={balance.value}{what}",
        lambda cfg: (
            f"{_selfverify('schedule')}={_sv(cfg).schedule.value}, {_selfverify('balance')}={_sv(cfg).balance.value}"
        ),
        f"set {_selfverify('schedule')}=joint and {_selfverify('balance')}={balance.value}",
    )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        (_selfverify("every"),),
        lambda cfg: _sv(cfg).schedule is SelfVerifySchedule.interleave,
        "by the interleaved schedule (a verification step every N steps)",
        lambda cfg: f"{_selfverify('schedule')}={_sv(cfg).schedule.value}",
        f"set {_selfverify('schedule')}=interleave too",
    ),
    _joint_with("fraction", SelfVerifyBalance.share, " (the share of a batch's groups that verify)"),
    _joint_with("pairs_per_step", SelfVerifyBalance.pairs),
    OnlyWith(
        (_selfverify("yes_share"), _selfverify("per_problem")),
        lambda cfg: _sv(cfg).balance is SelfVerifyBalance.share,
        "by balance=share",
        lambda cfg: f"{_selfverify('balance')}={_sv(cfg).balance.value} draws matched pairs",
        f"set {_selfverify('balance')}=share too",
    ),
    OnlyWith(
        (_selfverify("supervised_weight"),),
        lambda cfg: _sv(cfg).objective is SelfVerifyObjective.supervised,
        "by the supervised verdict loss (objective=supervised)",
        lambda cfg: f"{_selfverify('objective')}={_sv(cfg).objective.value}",
        f"set {_selfverify('objective')}=supervised too",
    ),
    OnlyWith(
        (_selfverify("loss_on"), _selfverify("scale_by_pass_rate")),
        lambda cfg: _sv(cfg).objective is SelfVerifyObjective.grpo,
        "when verification prompts join the GRPO batch (objective=grpo)",
        lambda cfg: f"{_selfverify('objective')}={_sv(cfg).objective.value} keeps them out of it",
        f"set {_selfverify('objective')}=grpo",
    ),
)
