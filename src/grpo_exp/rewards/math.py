"""Math accuracy with math-verify: the completion's final answer against the reference.

The final answer is read by the run's extractor (verifier.answer; for numbers: the last \\boxed{} content, else the
last number written, '... so 3 + 4 = 7', '#### 72'); math-verify then decides equivalence (fractions, LaTeX,
units). An answer that is the arithmetic itself ('\\boxed{5 - 33}' for -28) scores 0: restating the question is
not solving it. TRL's `accuracy_reward` is not used because it accepts LaTeX-anchored answers only, which would
score a plain '7' as wrong.
"""

from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.text import completion_text
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.rule import answer_score


@dataclass
class MathReward:
    # 1 when the final answer equals the reference (math-verify); None (skipped) for an unparseable reference.
    weight: float = MISSING


@reward_component("math", MathReward)
def make_math_reward(verifier: Labels):
    def math(completions, solution, **kwargs) -> list[float | None]:
        """1.0 when the final answer equals the reference; None (skipped) for a missing or unparseable reference
        (verification prompts of the self-verification task have none)."""
        return [
            None if s is None else answer_score(completion_text(c), s, verifier.answer)
            for c, s in zip(completions, solution, strict=True)
        ]

    return math
