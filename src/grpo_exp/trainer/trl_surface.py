"""TRL's GRPOTrainer as grpo_exp's run and tests use it (metrics, saving, the batch layout, generation outside a step,
the last batch's rewards), and the last generation batch as the seam's overrides read it from TRL's state (its
rewards, the scored batch, the trainer's log-probabilities, a gather): each a translation to TRL's own attributes
and methods (declared in grpo_exp.trainer.trl_contract). A mixin of grpo_exp.trainer.seam.HookedGRPOTrainer; it
overrides nothing of TRL's.
"""

import contextlib

import torch
from accelerate.utils import gather_object
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation

from grpo_exp.rollout.vllm_turns import answered_by, turn_engine
from grpo_exp.trainer.mismatch import completion_sequences
from grpo_exp.trainer.scored_batch import ROW_KEYS, ScoredBatch, aggregated_reward


def save_checkpoint(trainer) -> None:
    """A resumable checkpoint of a transformers Trainer's current step (GRPO's, the warm-up's SFTTrainer): weights,
    optimiser, scheduler, RNG, trainer state."""
    trainer._save_checkpoint(trainer.model, trial=None)


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
        save_checkpoint(self)

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
            if not self.use_vllm:
                yield model
                return
            # the run generates with vLLM: so do its evaluations, from the engine synced to the policy as it is now
            sync_now = getattr(self.vllm_generation, "sync_now", None)  # generation=vllm_async's pipeline
            if sync_now is not None:
                sync_now()
            elif self.state.global_step != self._last_loaded_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            with turn_engine(self.vllm_generation, 64) as engine, answered_by(engine):
                yield model

    def prompt_ids(self, rows: list[dict]) -> list[list[int]]:
        """The token ids of the rows' prompts, as TRL's generation tokenizes them (its chat template, its tools)."""
        return self._tokenize_prompts([row["prompt"] for row in rows])[0]

    def last_rewards(self, name: str) -> list[float]:
        """Reward component `name` of every completion of the last generation batch (gathered), as TRL logged it."""
        return list(self._logs["rewards"][name])

    # ---- the last generation batch, read from TRL's state for the seam's overrides (grpo_exp.trainer.seam) ----

    def gather_sums(self, sums: torch.Tensor) -> torch.Tensor:
        """[n] of this process -> [processes, n] on the CPU (a collective: every process calls it)."""
        return self.accelerator.gather(sums[None].to(self.accelerator.device)).cpu()

    def log_advantages(self, values: list[float]) -> None:
        """The advantages TRL logs for the last generation batch (its sample table, the scored batch), replaced."""
        self._logs["advantages"].clear()
        self._logs["advantages"].extend(values)

    @property
    def sharded(self) -> bool:
        """The policy's parameters are sharded over processes (DeepSpeed or FSDP)."""
        return self.is_deepspeed_enabled or self.is_fsdp_enabled

    @property
    def policy(self):
        """The policy model itself (unwrapped from its accelerator wrapper)."""
        return self.accelerator.unwrap_model(self.model)

    def current_sampler_log_probs(self, output: dict) -> torch.Tensor | None:
        """The batch's completions scored again by the sampler under the trainer's weights, beside TRL's batch
        ([rows, tokens], NaN where not scored): generation ahead's stale batches (grpo_exp.trainer.async_generation);
        None elsewhere, the same on every process."""
        take = getattr(self.vllm_generation, "take_rescored", None) if self.use_vllm else None
        rescored = take() if take is not None else None
        return None if rescored is None else rescored.aligned(output["completion_ids"])

    @torch.no_grad()
    def trainer_log_probs(self, output: dict) -> torch.Tensor:
        """The completions' log-probabilities under the trainer's forward (the loss's), before any update."""
        ids, attention, keep = completion_sequences(output)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            batch = self.args.per_device_train_batch_size
            logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, keep, batch)
        return logps

    def _logged_rewards(self) -> torch.Tensor:
        """[N, components]: the last generation batch's rewards as TRL logged them (gathered; NaN: skipped)."""
        return torch.tensor([list(self._logs["rewards"][n]) for n in self.reward_func_names], dtype=torch.float32).T

    def _total_reward(self, rewards: torch.Tensor) -> torch.Tensor:
        weights, aggregation = self.reward_weights.cpu(), self.multi_objective_aggregation
        return aggregated_reward(rewards, weights, aggregation, self.num_generations)

    def _most_rows(self, rows: int) -> int:
        """The largest `rows` of every process (each process calls this, at the same point of every step)."""
        return int(self.accelerator.gather(torch.tensor([rows], device=self.accelerator.device)).max())

    def _fused_forward(self, model, compute_entropy: bool, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TRL's fused LM head: each position's log-probability of its `shift_labels` token (and entropy), no logits."""
        with self.accelerator.autocast():
            out = model(**inputs, fused_lm_head=True)
        return out.log_probs, out.entropy if compute_entropy else None

    def _scored_batch(self, inputs: list[dict], output: dict) -> ScoredBatch:
        # TRL keeps exactly the last generation batch (gathered over processes) in these deques.
        rows = gather_object([{key: row.get(key) for key in ROW_KEYS} for row in inputs])
        rewards = self._logged_rewards()
        policy_tokens = output["completion_mask"] * output.get("tool_mask", 1)
        return ScoredBatch.of_generation(
            rows,
            list(self._logs["completion"]),
            group_size=self.num_generations,
            reward_names=list(self.reward_func_names),
            prompts=list(self._logs["prompt"]),
            rewards=rewards,
            imputed=self._imputed,
            total=self._total_reward(rewards),
            advantages=torch.tensor(list(self._logs["advantages"]), dtype=torch.float32),
            lengths=self.accelerator.gather(policy_tokens.sum(dim=1)).float().cpu(),
        )
