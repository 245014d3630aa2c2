"""Kimi k1.5's length reward (Kimi Team 2025, arXiv 2501.12599, section 2.3.3; open-r1's `len_reward`): among the
completions of one prompt, with len the length in tokens and min/max over that prompt's completions,

    lambda = 0.5 - (len - min_len) / (max_len - min_len)
    reward = lambda            for a correct completion
    reward = min(0, lambda)    for a wrong one

so the shortest correct answers gain, long ones lose, and a wrong answer is never paid for being short. All
completions of the same length: 0. Correctness is the run's own labels (verifier.labels). open-r1 takes min and max
over the whole batch; the paper, and this, over each prompt's group."""

from collections import defaultdict
from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.text import completion_text
from grpo_exp.verification.rule import Verifier


def length_rewards(lengths: list[int], correct: list[bool | None], groups: list) -> list[float]:
    """Each completion's reward, `groups[i]` naming the prompt it answers. A completion the labels cannot judge
    (None) counts as wrong: it is never paid for being short. Pure."""
    members = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    rewards = [0.0] * len(lengths)
    for indices in members.values():
        shortest, longest = min(lengths[i] for i in indices), max(lengths[i] for i in indices)
        if shortest == longest:
            continue
        for i in indices:
            scale = 0.5 - (lengths[i] - shortest) / (longest - shortest)
            rewards[i] = scale if correct[i] else min(0.0, scale)
    return rewards


@dataclass
class LengthByCorrectnessReward:
    # Kimi k1.5's length reward within each prompt's group, by the run's labels: 0.5 for the shortest, -0.5 for the
    # longest, linear between; a wrong completion gets at most 0
    weight: float = MISSING


@reward_component("length_by_correctness", LengthByCorrectnessReward)
def make_length_by_correctness_reward(verifier: Verifier):
    def length_by_correctness(completions, solution, prompts, completion_ids, task_entry=None, **kwargs):
        """Kimi k1.5's length reward within each prompt's group, by the run's labels."""
        texts = [completion_text(c) for c in completions]
        labels = verifier(texts, [None if s is None else str(s) for s in solution], task_entry)
        groups = [repr(p) for p in prompts]  # a conversational prompt is a list of messages
        return length_rewards([len(ids) for ids in completion_ids], labels, groups)

    return length_by_correctness
