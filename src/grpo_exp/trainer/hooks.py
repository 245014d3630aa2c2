"""The hooks a trainer subclass (grpo_exp.trainer.trainer) may implement around TRL's training step; the seam
(grpo_exp.trainer.seam) calls them at their points of TRL's step, in training only. The defaults do nothing."""

import torch

from grpo_exp.trainer.scored_batch import ScoredBatch


class TrainingHooks:
    """- `before_generation(inputs)` may replace the batch's rows before TRL generates for them;
    - `after_scoring(batch)` receives the ScoredBatch TRL has just produced, when `wants_scored_batch` (every
      generated batch, resampled ones included);
    - `loss_token_mask(rows, completion_ids, completion_mask)` may leave generated tokens out of the loss;
    - `auxiliary_loss(model)` may add a loss to TRL's at each training forward.
    """

    def before_generation(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def after_scoring(self, batch: ScoredBatch) -> None:
        pass

    def loss_token_mask(
        self, rows: list[dict], completion_ids: torch.Tensor, completion_mask: torch.Tensor
    ) -> torch.Tensor | None:
        """Which generated tokens of this process's rows the loss counts (1), on top of TRL's completion mask;
        None: all of them. None or not must be the same in every process (TRL's token count is gathered)."""
        return None

    def auxiliary_loss(self, model) -> torch.Tensor | None:
        """A loss added to TRL's at each training forward (None: nothing)."""
        return None

    @property
    def wants_scored_batch(self) -> bool:
        return False
