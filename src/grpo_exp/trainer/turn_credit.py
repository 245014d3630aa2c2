"""rollout.turn_credit=discounted_return on TRL's generation batch: each turn of a multi-turn trajectory credited with
its own discounted return (grpo_exp.rollout.flow has the statistics as pure functions), its advantage given to the
turn's tokens. TRL's loss takes the advantages per token ([B, T]) as it takes them per completion ([B])."""

import math

import torch

from grpo_exp.config_rules import OnlyWith
from grpo_exp.rollout.flow import discounted_returns, token_advantages, turn_advantages
from grpo_exp.schema import TurnCredit

ENVIRONMENT = "environment"  # the reward component the environment's step rewards are parts of
TURN_ADVANTAGES = "turn_advantages"  # each row's turns' advantages, as the rows carry them into the ScoredBatch


def credited_turns(
    turn_rewards: list[list[float]],
    totals: torch.Tensor,
    *,
    step_weight: float,
    group_size: int,
    scale: str,
    discount: float,
) -> list[list[float]]:
    """Every trajectory's turn advantages (the whole batch, every process's rows in order): its step rewards weighted
    as their reward component is in the mix, the total reward (NaN: unscored) completing the last turn's."""
    returns = []
    for rewards, total in zip(turn_rewards, totals.tolist(), strict=True):
        if not rewards or math.isnan(total):
            returns.append([math.nan] * max(len(rewards), 1))
        else:
            returns.append(discounted_returns([step_weight * r for r in rewards], total, discount))
    return turn_advantages(returns, group_size, scale)


def per_token(advantages: list[list[float]], turn_tokens: list[list[int]], policy_mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: each row's turn advantages spread over its policy tokens (`policy_mask` [B, T]: 1 for the policy's own
    tokens, 0 for observations and padding)."""
    rows = [
        token_advantages(own, tokens, mask)
        for own, tokens, mask in zip(advantages, turn_tokens, policy_mask.tolist(), strict=True)
    ]
    return torch.tensor(rows, dtype=torch.float32)


def groups_with_turn_signal(advantages: list[list[float]], group_size: int, noise: float = 1e-6) -> torch.Tensor:
    """[prompts] bool: groups in which some turn's advantage is not zero (they train even when their totals have no
    spread, which turns' own step rewards can give them)."""
    signal = [any(abs(a) > noise for a in turns) for turns in advantages]
    return torch.tensor(signal).view(-1, group_size).any(dim=1)


def turn_advantage_means(advantages: list[list[float]], prefix: str = "rollout/turn_advantage") -> dict[str, float]:
    """The mean advantage of each turn (1-based), over the trajectories that have it: where the credit went."""
    longest = max((len(turns) for turns in advantages), default=0)
    means = {}
    for turn in range(longest):
        values = [turns[turn] for turns in advantages if len(turns) > turn]
        means[f"{prefix}/{turn + 1}"] = sum(values) / len(values)
    return means


def credit_batch(
    rows: list[dict],
    turns: list[tuple[list[float], list[int]]],
    totals: torch.Tensor,
    policy_mask: torch.Tensor,
    *,
    first: int,
    step_weight: float,
    group_size: int,
    scale: str,
    discount: float,
) -> tuple[torch.Tensor, list[list[float]]]:
    """This process's `rows` (from `first` in the batch) credited from every process's `turns` ((step rewards, turn
    tokens) per trajectory, gathered: each process computes the same): [B, T] advantages per token for its rows
    (`policy_mask` [B, T]), and every trajectory's turn advantages. Each row carries its own under TURN_ADVANTAGES
    (what each turn trains with, for the samples' log)."""
    advantages = credited_turns(
        [rewards for rewards, _ in turns],
        totals,
        step_weight=step_weight,
        group_size=group_size,
        scale=scale,
        discount=discount,
    )
    own = advantages[first : first + len(rows)]
    own_tokens = [tokens for _, tokens in turns[first : first + len(rows)]]
    for row, row_turns in zip(rows, own, strict=True):
        row[TURN_ADVANTAGES] = row_turns
    return per_token(own, own_tokens, policy_mask), advantages


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("rollout.discount",),
        lambda cfg: cfg.rollout.turn_credit is TurnCredit.discounted_return,
        "by the per-turn credit (rollout.turn_credit=discounted_return)",
        lambda cfg: "rollout.turn_credit=outcome credits the whole outcome to every turn",
        "set rollout.turn_credit=discounted_return",
    ),
)
