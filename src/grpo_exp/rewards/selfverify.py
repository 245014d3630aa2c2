"""The self-verification reward: was the policy's Yes/No judgement of a sampled answer right?

Scores only the verification prompts that GRPOExpTrainer mixes into batches (task == "verify"); other
samples get None (skipped by this component). A malformed judgement (no boxed Yes/No; with
strict_verdict=false, no Yes/No word at all) earns 0.
"""

from grpo_exp.schema import SelfVerifySchedule
from grpo_exp.text import completion_text
from grpo_exp.verification.selfverify import parse_judgement, verification_reward

SHOW = ("answer", "solution")


def make_selfverify_reward(
    schedule: str = "joint",
    every: int = 5,
    fraction: float = 0.5,
    show: str = "answer",
    drop_no_answer: bool = True,
    drop_all_wrong: bool = True,
    yes_share: float = 0.5,
    per_problem: int = 2,
    scale_by_pass_rate: bool = False,
    strict_verdict: bool = True,
    buffer_size: int = 64,
    template: str = "{question} {answer}",
):
    """The settings other than `scale_by_pass_rate` drive the task in GRPOExpTrainer; they are checked here."""
    if schedule not in {s.value for s in SelfVerifySchedule}:
        raise ValueError(f"schedule='{schedule}' is not one of {[s.value for s in SelfVerifySchedule]}")
    if show not in SHOW:
        raise ValueError(f"show='{show}' is not one of {list(SHOW)}")
    if not (0 < fraction <= 1 and 0 <= yes_share <= 1 and every >= 1 and per_problem >= 1 and buffer_size >= 1):
        raise ValueError("need 0 < fraction <= 1, 0 <= yes_share <= 1, every >= 1, per_problem >= 1, buffer_size >= 1")

    def selfverify(completions, task=None, verify_label=None, pass_rate=None, **kwargs) -> list[float | None]:
        rows = zip(completions, task or [None] * len(completions), verify_label or [None] * len(completions),
                   pass_rate or [None] * len(completions), strict=True)  # fmt: skip
        return [
            verification_reward(parse_judgement(completion_text(c), strict_verdict), label, rate, scale_by_pass_rate)
            if kind == "verify"
            else None
            for c, kind, label, rate in rows
        ]

    return selfverify
