"""Flow-GRPO's credit assignment and trajectory statistics, as pure functions.

A group is the G trajectories of one prompt. Each trajectory is one member whatever its number of turns:
its outcome reward is normalised against the group's (TRL's formula), and the resulting advantage is given
to every one of its turns (AgentFlow's public code instead makes each turn a sample, so long trajectories
weigh more; grpo_exp follows the paper's trajectory-level groups).
"""

import math
from collections import defaultdict

import torch

from grpo_exp.answers import AnswerExtractor

EPSILON = 1e-4  # TRL's guard against a zero group std


def group_advantages(rewards: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """rewards [P, G] (one per trajectory) -> advantages [P, G]: reward minus its group's mean, divided by the
    group's (Bessel-corrected) std + 1e-4 when `scale`; NaN rewards (unscorable) get 0 and leave the baseline."""
    mean = torch.nanmean(rewards, dim=1, keepdim=True)
    advantages = rewards - mean
    if scale:
        count = (~torch.isnan(rewards)).sum(dim=1, keepdim=True)
        variance = torch.nansum(advantages**2, dim=1, keepdim=True) / (count - 1).clamp(min=1)
        advantages = advantages / (variance.sqrt() + EPSILON)
    return advantages.nan_to_num(0.0)


def broadcast_to_turns(values: list[float], turns: list[int]) -> list[list[float]]:
    """One value per trajectory -> that value for each of its turns."""
    return [[value] * count for value, count in zip(values, turns, strict=True)]


def turn_spans(env_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of the policy's tokens (mask 1) between observations (mask 0)."""
    spans, start = [], None
    for index, flag in enumerate([*env_mask, 0]):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            spans.append((start, index))
            start = None
    return spans


def reward_by_turns(rewards: list[float], turns: list[int]) -> dict[int, float]:
    """Mean reward of the trajectories with each number of turns (NaN rewards left out)."""
    by_turns: dict[int, list[float]] = defaultdict(list)
    for reward, count in zip(rewards, turns, strict=True):
        if not math.isnan(reward):
            by_turns[count].append(reward)
    return {count: sum(values) / len(values) for count, values in sorted(by_turns.items())}


def trajectory_statistics(
    records: list[dict], rewards: list[float], extract: AnswerExtractor, prefix: str = "rollout"
) -> dict[str, float]:
    """Per-trajectory means (each trajectory counts once) over records with `num_turns`, `tool_calls`,
    `tool_errors` and `final_turn` (grpo_exp.rollout's fields): turns, tool calls and errors, the share that
    ended with a final answer (`extract`: the run's answer extractor), and the reward by number of turns."""
    n = len(records)
    turns = [r["num_turns"] for r in records]
    calls = sum(r["tool_calls"] for r in records)
    errors = sum(r["tool_errors"] for r in records)
    stats = {
        f"{prefix}/turns_mean": sum(turns) / n,
        f"{prefix}/turns_max": float(max(turns)),
        f"{prefix}/tool_calls_mean": calls / n,
        f"{prefix}/tool_errors_mean": errors / n,
        f"{prefix}/tool_error_rate": errors / calls if calls else 0.0,
        f"{prefix}/used_tool_frac": sum(r["tool_calls"] > 0 for r in records) / n,
        f"{prefix}/final_answer_frac": sum(extract(r["final_turn"]) is not None for r in records) / n,
    }
    stats |= {f"{prefix}/reward_by_turns/{count}": value for count, value in reward_by_turns(rewards, turns).items()}
    return stats
