"""The one seam between grpo_exp and TRL's GRPOTrainer internals.

Everything grpo_exp needs of TRL's private state is read here and nowhere else: the batch TRL has just
generated and scored (`_logs`, kept by `_generate_and_score_completions`), the per-component rewards before
TRL aggregates them (`_calculate_rewards`: failed scores imputed), its metric store (`_metrics`),
its checkpointing (`_save_checkpoint`), and what a custom rollout needs (`model_wrapped`,
`generation_kwargs`). TRL is pinned to one minor version (pyproject.toml) and tests/test_trl_contract.py
fails loudly when an upgrade changes any of it, TRL's reward aggregation included.

The trainer subclass (grpo_exp.trainer.trainer) sees two hooks and a typed ScoredBatch, never TRL's state.
"""

import math
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import nanstd

from grpo_exp.rollout.multiturn import TRAJECTORY_FIELDS
from grpo_exp.stats import impute_group_means
from grpo_exp.text import completion_text

# Dataset / rollout columns carried from the inputs into the ScoredBatch rows (None where a row lacks them).
ROW_KEYS = ("question", "solution", "task", "verify_label", "pass_rate", *TRAJECTORY_FIELDS)


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


class HookedGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer, unmodified, with two hooks around its generation-and-scoring step (training only):

    - `before_generation(inputs)` may replace the batch's rows before TRL generates for them;
    - `after_scoring(batch)` receives the ScoredBatch TRL has just produced, when `wants_scored_batch`.
    """

    def before_generation(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def after_scoring(self, batch: ScoredBatch) -> None:
        pass

    @property
    def wants_scored_batch(self) -> bool:
        return False

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's per-component rewards (gathered over processes), with a component's failures for some members of
        a group given the group's mean (stats.impute_group_means). Under normalize_then_sum TRL already gives a
        missing value a z-score of 0, so nothing is imputed there."""
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._imputed = torch.zeros(rewards.shape, dtype=torch.bool)
        if not self.model.training or self.multi_objective_aggregation != "sum_then_normalize":
            return rewards
        rewards, imputed = impute_group_means(rewards, self.num_generations)
        self._imputed = imputed.cpu()
        for i, name in enumerate(self.reward_func_names):
            self.record_metric(f"rewards/{name}/imputed", float(imputed[:, i].sum()))
        return rewards

    def record_metric(self, key: str, value: float) -> None:
        """A scalar for this step: averaged with TRL's own metrics over the logging step, logged alongside them."""
        self._metrics["train"][key].append(value)

    def save_checkpoint(self) -> None:
        """A resumable checkpoint of the current step: weights, optimiser, scheduler, RNG, trainer state."""
        self._save_checkpoint(self.model, trial=None)

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training:
            inputs = self.before_generation(inputs)
        output = super()._generate_and_score_completions(inputs)
        if training and self.wants_scored_batch:
            self.after_scoring(self._scored_batch(inputs, output))
        return output

    def _scored_batch(self, inputs: list[dict], output: dict) -> ScoredBatch:
        # TRL keeps exactly the last generation batch (gathered over processes) in these deques.
        names = list(self.reward_func_names)
        rows = gather_object([{key: row.get(key) for key in ROW_KEYS} for row in inputs])
        trajectories = [completion_text(c) for c in self._logs["completion"]]
        multiturn = rows[0]["num_turns"] is not None
        rewards = torch.tensor([list(self._logs["rewards"][n]) for n in names], dtype=torch.float32).T
        policy_tokens = output["completion_mask"] * output.get("tool_mask", 1)
        return ScoredBatch(
            group_size=self.num_generations,
            reward_names=names,
            prompts=list(self._logs["prompt"]),
            # A multi-turn trajectory is judged by its final turn (the tools' output is not the policy's answer).
            texts=[row["final_turn"] for row in rows] if multiturn else trajectories,
            trajectories=trajectories if multiturn else None,
            rows=rows,
            rewards=rewards,
            imputed=self._imputed,
            total=aggregated_reward(
                rewards, self.reward_weights.cpu(), self.multi_objective_aggregation, self.num_generations
            ),
            advantages=torch.tensor(list(self._logs["advantages"]), dtype=torch.float32),
            lengths=self.accelerator.gather(policy_tokens.sum(dim=1)).float().cpu(),
        )


def as_rollout_func(rollout):
    """TRL's `rollout_func(prompts, trainer)` for a rollout object with `trl_batch(model, tokenizer, prompts,
    generation_kwargs) -> dict` (grpo_exp.rollout.multiturn.MultiTurnRollout)."""

    def rollout_func(prompts: list, trainer) -> dict:
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            return rollout.trl_batch(model, trainer.processing_class, prompts, trainer.generation_kwargs)

    return rollout_func
