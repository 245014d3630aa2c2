"""Repetition shaping: TRL's n-gram repetition penalty, under the component name `repetition`."""

from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import knob


@dataclass
class RepetitionReward:
    weight: float = MISSING
    ngram_size: int = knob(3, ge=1)
    max_penalty: float = knob(-1.0, le=0.0)  # the reward of a completion that only repeats itself


@reward_component("repetition", RepetitionReward)
def make_repetition_reward(ngram_size: int, max_penalty: float):
    from trl.rewards import get_repetition_penalty_reward  # TRL: when a run builds it, not for --help

    penalty = get_repetition_penalty_reward(ngram_size=ngram_size, max_penalty=max_penalty)

    def repetition(completion_ids, **kwargs) -> list[float]:
        """0 for no repeated token n-gram, down to max_penalty for a completion made of one repeated n-gram."""
        return penalty(completion_ids)

    return repetition
