"""Correctness by the run's own labels (`verifier.labels`): the accuracy reward of any task.

`math` is always math-verify; `correct` asks the labeller every other statistic of the run reads (math_verify,
exact_match, or the user's function), so a task that is not mathematics trains on its own notion of correct:
    grpo-exp train reward=correct verifier.labels=my_checks:is_correct
"""

from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.text import completion_text
from grpo_exp.verification.rule import Verifier


@dataclass
class CorrectReward:
    # 1 when the run's correctness labels (verifier.labels: math_verify, exact_match or the user's function) say
    # correct, 0 when not; None (skipped) when they cannot judge: any task's accuracy reward, by its own verifier.
    weight: float = MISSING


@reward_component("correct", CorrectReward)
def make_correct_reward(verifier: Verifier):
    def correct(completions, solution, task_entry=None, **kwargs) -> list[float | None]:
        """1.0 when the run's labels say correct, 0.0 when not; None (skipped) when they cannot judge or there is
        no reference (verification prompts of the self-verification task have none)."""
        texts = [completion_text(c) for c in completions]
        labels = verifier(texts, [None if s is None else str(s) for s in solution], task_entry)
        return [None if label is None else float(label) for label in labels]

    return correct
