"""Confidence reward: a generative verifier's P(Yes) that the policy's answer is correct (GenRM-style).

Useful where no reference answer exists. It needs a probability, so verifier=genrm or verifier=self; the
scorer is built once by the run (grpo_exp.run.build) and shared with whoever else needs it.
"""

from grpo_exp.text import completion_text, prompt_text
from grpo_exp.verification.p_yes import PYesScorer


def make_confidence_reward(p_yes: PYesScorer):
    def confidence(prompts, completions, **kwargs) -> list[float]:
        """P(Yes) of the verifier asked whether the completion correctly answers the prompt."""
        return p_yes([prompt_text(p) for p in prompts], [completion_text(c) for c in completions])

    return confidence
