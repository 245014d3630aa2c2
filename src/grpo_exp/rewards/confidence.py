"""Confidence reward: a generative verifier's P(Yes) that the policy's answer is correct (GenRM-style).

Useful where no reference answer exists. It needs a probability, so scorer=genrm or scorer=self; the
scorer is built once by the run (grpo_exp.run.build) and shared with whoever else needs it.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import MISSING, DictConfig

from grpo_exp.errors import UserError
from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import ScorerName, ShownPart
from grpo_exp.text import completion_text, prompt_text
from grpo_exp.verification.labels import Labels

if TYPE_CHECKING:  # its module loads torch and transformers, which naming the component needs not
    from grpo_exp.verification.p_yes import PYesScorer


@dataclass
class ConfidenceReward:
    # The verifier's P(Yes) that the answer is correct: needs scorer=genrm or scorer=self.
    weight: float = MISSING
    # What the verifier is shown: answer: the question and the completion's final answer (a completion without
    # one scores 0), as the self-verification task and the verification benchmark ask | solution: the prompt
    # and the whole completion
    show: ShownPart = ShownPart.answer


def _check_in_run(settings: DictConfig, cfg: DictConfig, processes: int) -> None:
    if cfg.scorer.name is ScorerName.none:
        raise UserError(
            "reward component 'confidence' needs a probability of correctness: use scorer=genrm (a frozen "
            "verifier) or scorer=self (the policy); scorer=none gives the correctness labels only"
        )


@reward_component("confidence", ConfidenceReward, graded=True, check=_check_in_run)
def make_confidence_reward(p_yes: "PYesScorer", show: ShownPart, verifier: Labels):
    def confidence(prompts, completions, question=None, **kwargs) -> list[float]:
        """P(Yes) of the verifier asked whether the completion correctly answers the prompt."""
        texts = [completion_text(c) for c in completions]
        if show is ShownPart.solution or question is None:
            return p_yes([prompt_text(p) for p in prompts], texts)
        answers = [verifier.answer(t) for t in texts]  # the run's extractor (verifier.answer)
        shown = [i for i, a in enumerate(answers) if a is not None]
        scores = [0.0] * len(texts)  # no final answer: nothing to be confident in
        if shown:
            for i, score in zip(shown, p_yes([question[i] for i in shown], [answers[i] for i in shown]), strict=True):
                scores[i] = score
        return scores

    return confidence
