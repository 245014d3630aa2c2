"""Confidence reward: a generative verifier's P(Yes) that the policy's answer is correct (GenRM-style).

Useful where no reference answer exists. It needs a probability, so verifier=genrm or verifier=self.
"""

from omegaconf import OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.rewards.judge import prompt_text
from grpo_exp.rewards.text import completion_text
from grpo_exp.schema import ModelSchema, VerifierName, VerifierSchema
from grpo_exp.verification import build_p_yes


def make_confidence_reward(verifier: dict, policy: dict, cache_dir: str):
    verifier_cfg = OmegaConf.merge(OmegaConf.structured(VerifierSchema), verifier)
    if verifier_cfg.name is VerifierName.math_verify:
        raise UserError(
            "reward component 'confidence' needs a probability of correctness: use verifier=genrm (a frozen "
            "verifier) or verifier=self (the policy); verifier=math_verify only gives labels"
        )
    scorer = build_p_yes(verifier_cfg, OmegaConf.merge(OmegaConf.structured(ModelSchema), policy), cache_dir)

    def confidence(prompts, completions, **kwargs) -> list[float]:
        """P(Yes) of the verifier asked whether the completion correctly answers the prompt."""
        return scorer([prompt_text(p) for p in prompts], [completion_text(c) for c in completions])

    confidence.scorer = scorer  # experiment.py binds the live policy here for verifier=self
    return confidence
