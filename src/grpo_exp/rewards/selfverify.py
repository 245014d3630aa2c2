"""The self-verification reward: was the policy's Yes/No judgement of a sampled answer right?

Scores only the verification prompts that GRPOExpTrainer mixes into batches (task == "verify"); other
samples get None (skipped by this component). A malformed judgement (no boxed Yes/No; with
strict_verdict=false, no Yes/No word at all) earns 0.
"""

from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
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


@reward_component("selfverify", SelfVerifyReward)
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
