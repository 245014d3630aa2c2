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
RETURN_NOISE = 1e-6  # first-turn returns spread less than this have none (per-turn credit)


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
    `tool_errors`, `final_turn` and `cut` (grpo_exp.rollout's fields): turns, tool calls and errors, the share that
    ended with a final answer (`extract`: the run's answer extractor), the share whose last turn was cut at
    rollout.max_tokens_per_turn, and the reward by number of turns."""
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
        # a game's last move ends without an EOS, which TRL's completions/clipped_ratio counts as cut: this does not
        f"{prefix}/cut_frac": sum(bool(r.get("cut")) for r in records) / n,
    }
    stats |= {f"{prefix}/reward_by_turns/{count}": value for count, value in reward_by_turns(rewards, turns).items()}
    return stats


# ---- per-turn credit (rollout.turn_credit=discounted_return) -----------------------------------------------------


def discounted_returns(step_rewards: list[float], total: float, discount: float) -> list[float]:
    """Each turn's discounted return G_k = sum_{j>=k} discount^(j-k) r_j, where r_j is turn j's step reward and the
    last turn's reward also holds what the trajectory's total reward has beyond its steps' (total - sum of the step
    rewards: the other reward components, and the outcome the environment did not give step by step). With
    discount 1, the first turn's return is the total; with no step rewards every turn's is total * discount^(K-1-k)."""
    rewards = list(step_rewards)
    rewards[-1] += total - sum(step_rewards)
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + discount * running
        returns.append(running)
    return returns[::-1]


def turn_advantages(returns: list[list[float]], group_size: int, scale: str) -> list[list[float]]:
    """Per trajectory (in groups of `group_size` consecutive ones), each turn's advantage: its return minus the
    group's mean first-turn return, divided (scale: TRL's trainer.scale_rewards) by the group's ("group") or the
    batch's ("batch") std of the first-turn returns + 1e-4, or not at all ("none"). Where that std is 0 (every
    first turn equal, up to 1e-6 of float rounding) the difference is left unscaled, so that a spread in the later
    turns alone is not blown up by 1/1e-4. A constant per group, the baseline leaves the gradient of every turn
    unbiased. A trajectory with no score (NaN) gets 0 on every turn and leaves the statistics. With discount 1 and
    no step rewards this is exactly Flow-GRPO's (group_advantages) on every turn."""
    first = torch.tensor([r[0] for r in returns], dtype=torch.float64).view(-1, group_size)
    mean = torch.nanmean(first, dim=1, keepdim=True)
    if scale == "batch":
        valid = first[~torch.isnan(first)]
        std = (valid.std() if valid.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)).expand_as(mean)
    else:
        count = (~torch.isnan(first)).sum(dim=1, keepdim=True)
        std = (torch.nansum((first - mean) ** 2, dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    spread = std > RETURN_NOISE  # float noise (first returns equal but for rounding) is no spread
    divisor = torch.where(spread & torch.tensor(scale != "none"), std + EPSILON, torch.ones_like(std))
    advantages = []
    for index, turns in enumerate(returns):
        group = index // group_size
        if math.isnan(turns[0]):
            advantages.append([0.0] * len(turns))
            continue
        advantages.append([float((g - mean[group, 0]) / divisor[group, 0]) for g in turns])
    return advantages


def token_advantages(advantages: list[float], turn_tokens: list[int], policy_mask: list[int]) -> list[float]:
    """One advantage per completion position: the policy's tokens (mask 1), in order, belong to the turns by their
    token counts (`turn_tokens`) and take their turn's advantage; observations (mask 0) and tokens past the turns
    (none, or padding) take 0. A completion cut short by the length limit keeps the turns it holds."""
    per_token = [0.0] * len(policy_mask)
    owners = [turn for turn, count in enumerate(turn_tokens) for _ in range(count)]
    seen = 0
    for position, flag in enumerate(policy_mask):
        if flag and seen < len(owners):
            per_token[position] = advantages[owners[seen]]
            seen += 1
    return per_token
