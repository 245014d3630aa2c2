"""TRL's GRPOTrainer as grpo_exp's run and tests use it: metrics, saving, the batch layout, generation outside a step,
the last batch's rewards, each a translation to TRL's own attributes and methods (declared in
grpo_exp.trainer.trl_contract). A mixin of grpo_exp.trainer.seam.HookedGRPOTrainer; it overrides nothing of TRL's.
"""

import contextlib

import torch
from trl.models.utils import unwrap_model_for_generation


class TRLSurface:
    def record_metric(self, key: str, value: float) -> None:
        """A scalar for this step: averaged with TRL's own metrics over the logging step, logged alongside them."""
        self._metrics["train"][key].append(value)

    def _record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.record_metric(key, value)

    def watch_logs_first(self, callback) -> None:
        """`callback` sees each log before every other callback (TRL's trackers, metrics.jsonl, the console), so that
        what it adds to a step's logs reaches all of them at that step."""
        self.callback_handler.callbacks.insert(0, callback)

    def save_model_to(self, directory) -> None:
        """The model (and tokenizer) alone, for inference: every process calls it (sharded weights are gathered)."""
        self.save_model(str(directory))

    def batch_layout(self) -> dict:
        """As TRL runs it: the group size and the per-process batch it derived, over this many processes."""
        return {
            "trl_num_generations": self.num_generations,
            "per_device_train_batch_size": self.args.per_device_train_batch_size,
            "processes": self.accelerator.num_processes,
        }

    def save_checkpoint(self) -> None:
        """A resumable checkpoint of the current step: weights, optimiser, scheduler, RNG, trainer state."""
        self._save_checkpoint(self.model, trial=None)

    def generate_and_score(self, inputs: list[dict]) -> dict:
        """TRL's generation batch for `inputs` (each prompt's row G times), as the training loop makes it."""
        return self._generate_and_score_completions(inputs)

    def per_token_logps(
        self, model, input_ids, attention_mask, logits_to_keep: int, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The loss forward: each completion token's log-probability (and entropy), [B, logits_to_keep]."""
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=compute_entropy
        )
        return logps, entropies

    @property
    def sampling_settings(self) -> tuple[int, float]:
        """(max new tokens, temperature) of training's sampling."""
        return self.max_completion_length, self.temperature

    @contextlib.contextmanager
    def policy_for_generation(self):
        """The policy, ready to generate outside a training step (held-out evaluation): unwrapped as TRL unwraps it
        for its own generation; under ZeRO-3 its parameters gathered once (trainer.extra.ds3_gather_for_generation),
        so that generation makes no collective call per forward and every process may run its own number of them."""
        gather = self.args.ds3_gather_for_generation
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=gather
        ) as model:
            yield model

    def last_rewards(self, name: str) -> list[float]:
        """Reward component `name` of every completion of the last generation batch (gathered), as TRL logged it."""
        return list(self._logs["rewards"][name])
