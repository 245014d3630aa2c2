"""Repetition shaping: TRL's n-gram repetition penalty, under the component name `repetition`."""

from trl.rewards import get_repetition_penalty_reward


def make_repetition_reward(ngram_size: int, max_penalty: float):
    penalty = get_repetition_penalty_reward(ngram_size=ngram_size, max_penalty=max_penalty)

    def repetition(completion_ids, **kwargs) -> list[float]:
        """0 for no repeated token n-gram, down to max_penalty for a completion made of one repeated n-gram."""
        return penalty(completion_ids)

    return repetition
