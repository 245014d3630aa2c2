"""Length shaping: prefer concise completions."""

from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import knob
from grpo_exp.text import completion_text


@dataclass
class LengthReward:
    weight: float = MISSING
    target_chars: int = knob(400, ge=1)  # 1 for an empty completion, falling linearly to 0 at this length


@reward_component("length", LengthReward)
def make_length_reward(target_chars: int):
    def length(completions, **kwargs) -> list[float]:
        """1 for an empty completion, falling linearly to 0 at target_chars characters."""
        return [max(0.0, 1.0 - len(completion_text(c)) / target_chars) for c in completions]

    return length
