"""Length shaping: prefer concise completions."""

from grpo_exp.text import completion_text


def make_length_reward(target_chars: int):
    def length(completions, **kwargs) -> list[float]:
        """1 for an empty completion, falling linearly to 0 at target_chars characters."""
        return [max(0.0, 1.0 - len(completion_text(c)) / target_chars) for c in completions]

    return length
