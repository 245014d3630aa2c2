"""ScoredBatch: one generation batch as TRL scored it, typed; and TRL's aggregation of its reward components.

The seam (grpo_exp.trainer.seam) builds it from TRL's state; the trainer's hooks and the zero-variance rules read it.
`aggregated_reward` mirrors TRL 1.16's aggregation, which tests/test_trl_contract.py checks against TRL itself.
"""

import math
from dataclasses import dataclass

import torch
from trl.trainer.utils import nanstd

from grpo_exp.rollout.multiturn import TRAJECTORY_FIELDS
from grpo_exp.text import completion_text

TASK_COLUMNS = ("task_name", "task_level")  # a reasoning-gym row's task and (dataset.levels) level

# Dataset / rollout columns carried from the inputs into the ScoredBatch rows (None where a row lacks them).
ROW_KEYS = (
    "question",
    "solution",
    "task",
    "verify_label",
    "pass_rate",
    *TASK_COLUMNS,
    "task_entry",
    *TRAJECTORY_FIELDS,
    "turn_advantages",  # rollout.turn_credit=discounted_return: what each turn trained with (grpo_exp.trainer.seam)
)


@dataclass
class ScoredBatch:
    """One generation batch as TRL scored it, gathered over processes: N = prompts x G completions, in groups of
    G consecutive rows (one prompt each)."""

    group_size: int
    reward_names: list[str]
    prompts: list  # the chat prompt of each completion
    texts: list[str]  # the text the rewards scored (a multi-turn trajectory: its final turn)
    trajectories: list[str] | None  # multi-turn: each whole trajectory (policy turns and observations); else None
    rows: list[dict]  # the dataset / rollout columns of each completion (ROW_KEYS and the rollout's fields)
    rewards: torch.Tensor  # [N, components] as TRL used them: NaN where a component skipped the completion
    imputed: torch.Tensor  # [N, components] bool: a failed score replaced by its group's mean (impute_group_means)
    total: torch.Tensor  # [N] the reward TRL normalised into advantages (aggregated_reward); NaN: unscorable
    advantages: torch.Tensor  # [N] as TRL computed them
    lengths: torch.Tensor  # [N] the policy's own tokens (a multi-turn trajectory's observations left out)

    @classmethod
    def of_generation(cls, rows: list[dict], completions: list, **measured) -> "ScoredBatch":
        """The batch of these rows and TRL's completions (chat messages or text); `measured`: the other fields. A
        multi-turn trajectory is judged by its final turn (the tools' output is not the policy's answer)."""
        trajectories = [completion_text(c) for c in completions]
        if rows[0]["num_turns"] is None:
            return cls(rows=rows, texts=trajectories, trajectories=None, **measured)
        return cls(rows=rows, texts=[row["final_turn"] for row in rows], trajectories=trajectories, **measured)

    def grouped(self, values: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [prompts, G, ...]."""
        return values.view(-1, self.group_size, *values.shape[1:])


def aggregated_reward(rewards: torch.Tensor, weights: torch.Tensor, aggregation: str, group_size: int) -> torch.Tensor:
    """The reward TRL turns into advantages, from the per-component rewards [N, C] (NaN: skipped), as TRL 1.16
    aggregates them: `sum_then_normalize` takes the weighted nansum; `normalize_then_sum` first normalises each
    component inside its group (minus the group's mean, over its std + 1e-4). Either way a completion that every
    component skipped is unscorable (NaN), not 0."""
    if aggregation == "normalize_then_sum":
        grouped = rewards.view(-1, group_size, rewards.shape[1])
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        std = nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
        rewards_for_sum = ((grouped - mean) / (std + 1e-4)).view(-1, rewards.shape[1])
    elif aggregation == "sum_then_normalize":
        rewards_for_sum = rewards
    else:
        raise ValueError(f"unknown multi_objective_aggregation '{aggregation}'")
    total = (rewards_for_sum * weights).nansum(dim=1)
    total[torch.isnan(rewards).all(dim=1)] = math.nan
    return total
