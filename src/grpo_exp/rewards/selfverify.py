"""The self-verification reward: was the policy's Yes/No judgement of a sampled answer right?

Scores only the verification prompts that GRPOExpTrainer mixes into batches (task == "verify"); other
samples get None (skipped by this component). A malformed judgement (no boxed Yes/No; with
strict_verdict=false, no Yes/No word at all) earns 0.
"""

from grpo_exp.text import completion_text
from grpo_exp.verification.selfverify import parse_judgement, verification_reward


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
