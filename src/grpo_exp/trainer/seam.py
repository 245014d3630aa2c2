"""The one seam between grpo_exp and TRL's GRPOTrainer internals: it overrides TRL's methods, each a short delegation
to a feature module beside it (zero_variance, imputation, sampling, shared_prompt, advantages, losses, turn_credit).
It translates; the features decide. TRL's state is read here and in grpo_exp.trainer.trl_surface (mixed into the same
class), both declared in trl_contract and checked by tests/test_trl_contract.py against the installed TRL."""

import functools

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context

from grpo_exp.rollout.native import settled_episodes
from grpo_exp.sampled_log_probs import SampledLogProbs
from grpo_exp.schema import ZeroVarianceGroups
from grpo_exp.trainer.advantages import TRL_ADVANTAGES, estimate
from grpo_exp.trainer.async_generation import generation_ahead
from grpo_exp.trainer.hooks import TrainingHooks
from grpo_exp.trainer.imputation import impute_failures
from grpo_exp.trainer.lm_head_positions import labelled_positions_only
from grpo_exp.trainer.lm_head_tile import set_lm_head_tile
from grpo_exp.trainer.losses import policy_loss
from grpo_exp.trainer.mismatch import MismatchWatch
from grpo_exp.trainer.sampling import Sampler, fast_generation_pays
from grpo_exp.trainer.shared_prompt import shared_prompt_forward
from grpo_exp.trainer.trl_batch import mask_loss_tokens
from grpo_exp.trainer.trl_surface import TRLSurface
from grpo_exp.trainer.turn_credit import ENVIRONMENT, credit_batch, groups_with_turn_signal, turn_advantage_means
from grpo_exp.trainer.vllm_engine import vllm_generation_for
from grpo_exp.trainer.zero_variance import informative_loss, leaves_groups_out, no_spread_groups, resampler, settle


class HookedGRPOTrainer(TrainingHooks, TRLSurface, GRPOTrainer):
    """TRL's GRPOTrainer, unmodified, with the hooks (grpo_exp.trainer.hooks) called around its training step, and
    grpo_exp's trainer knobs read from `args` (a GRPOExpConfig)."""

    def __init__(self, *args, **kwargs):
        with vllm_generation_for(kwargs["args"], kwargs["model"]):  # generation=vllm_*: grpo_exp.trainer.vllm_engine
            super().__init__(*args, **kwargs)
        set_lm_head_tile(self.args.lm_head_tile_tokens)  # the loss's LM head, tile by tile (docs/scale.md)
        fast_pays = fast_generation_pays(
            device=self.accelerator.device.type,
            sharded=self.sharded,
            trl_samples_elsewhere=self.use_vllm or self.args.use_transformers_paged,
        )
        copy_in_bfloat16 = self.args.bfloat16_generation and not self.use_vllm  # vLLM's engine is the copy there
        self.sampler = Sampler(copy_in_bfloat16, self.args.fast_generation, fast_pays)
        trl_corrects = self.use_vllm and self.vllm_importance_sampling_correction
        self.mismatch = MismatchWatch(self.args, use_vllm=self.use_vllm, trl_corrects=trl_corrects)
        self.leaves_out_no_spread = leaves_groups_out(
            self.args.zero_variance_groups,
            beta=self.beta,
            entropy_bonus=self._entropy_bonus_enabled,
            top_entropy_quantile=self.top_entropy_quantile,
            aux_loss=self.aux_loss_enabled,
        )
        self.ahead = generation_ahead(self)  # generation=vllm_async: the pipeline in vllm_generation's place, or None
        self._imputed = None
        self.rollout_rows: list[dict] | None = None  # the rows being generated for (a rollout_func reads them)

    # ---- TRL's methods, overridden -------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's per-component rewards (gathered), failures for some of a group imputed (trainer.imputation)."""
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        applies = self.model.training and self.multi_objective_aggregation == "sum_then_normalize"
        names = self.reward_func_names
        rewards, self._imputed, metrics = impute_failures(rewards, self.num_generations, names, applies)
        self._record(metrics)
        return rewards

    def _generate_and_score_completions(self, inputs):
        """TRL's scored batch; in training, with the hooks, and no-spread groups resampled or marked for the loss
        to leave out (grpo_exp.trainer.zero_variance)."""
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        args, size = self.args, self.num_generations
        groups, step = len(inputs) // size, self.state.global_step
        more = resampler(self._generate_scored, self.train_dataset, groups, size, args.seed, step)
        with self.sampler.generating():
            output, metrics = settle(
                self._generate_scored(self.before_generation(inputs)),
                len(inputs),
                size,
                args.zero_variance_groups,
                args.max_resample_batches,
                more,
                self.processing_class.pad_token_id,
                self.leaves_out_no_spread,
                self.accelerator.process_index,
            )
        self._record(metrics)
        return output

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' draw of a step's batches; with generation=vllm_async, the coming steps' drawn ahead and sent
        to the server (grpo_exp.trainer.async_generation)."""
        draw = functools.partial(super().get_batch_samples, num_batches=num_batches, device=device)
        return draw(epoch_iterator) if self.ahead is None else self.ahead.batches_for_step(epoch_iterator, draw)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's single-turn generation; training text batches from the sampling copy where there is one
        (grpo_exp.trainer.sampling)."""
        policy = self.accelerator.unwrap_model(self.model)
        self.mismatch.see_policy(policy.dtype)
        training = self.model.training and images is None and not multimodal_fields  # text only
        copy = self.sampler.copy_to_sample(policy, prompt_ids[0]) if training else None
        with_log_probs = training and self.mismatch.wants_sampler_log_probs
        if copy is not None:
            with profiling_context(self, "transformers.generate"):
                step = self.state.global_step
                return self.sampler.generate(policy, prompt_ids, self.generation_config, step, with_log_probs)
        trls = functools.partial(super()._generate_single_turn, prompt_ids, images, multimodal_fields, num_generations)
        if not with_log_probs or self.use_vllm or self.args.use_transformers_paged:  # these return their own
            return trls(has_tool_images)
        with SampledLogProbs(policy, self.temperature) as record:
            completion_ids, _ = trls(has_tool_images)
        return completion_ids, record.of_lists(completion_ids)

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **extra,
    ):
        """TRL's per-token log-probabilities (and entropies) of the completions; with shared_prompt_forward, from
        one packed forward in which each group's prompt is read once (text models with a maskable attention)."""
        text_only = not compute_aux_loss and all(value is None for value in extra.values())  # multimodal
        with labelled_positions_only():  # on CPU too, not the prompt's positions (grpo_exp.trainer.lm_head_positions)
            if self.args.shared_prompt_forward and text_only:
                unwrapped = self.accelerator.unwrap_model(model)
                forward = functools.partial(self._fused_forward, model, compute_entropy)
                pad = self.processing_class.pad_token_id
                packed = shared_prompt_forward(unwrapped, input_ids, attention_mask, logits_to_keep, pad, forward)
                if packed is not None:
                    return *packed, None
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **extra
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss; with rows of no-spread groups marked, over the other rows only (grpo_exp.trainer.zero_variance):
        one unsharded process skips the forward of a batch with no informative row altogether; several processes
        each take as many rows as the process that keeps the most."""
        trl_loss = super().compute_loss

        def loss_of(rows: dict, items=num_items_in_batch) -> torch.Tensor:
            return trl_loss(model, rows, return_outputs, items)

        alone = self.accelerator.num_processes == 1 and not self.sharded
        most_rows = None if self.accelerator.num_processes == 1 else self._most_rows
        loss = informative_loss(inputs, self.loss_type, loss_of, model.parameters() if alone else None, most_rows)
        extra = None if return_outputs else self.auxiliary_loss(model)
        return loss if extra is None else loss + extra

    # ---- reading TRL's state -------------------------------------------------------------------------------

    def _generate_scored(self, inputs: list[dict]) -> tuple[dict, torch.Tensor | None]:
        """TRL's generation and scoring of one batch; the after_scoring hook; the loss_token_mask hook; which
        groups have no spread (None where nothing asks)."""
        self.rollout_rows = inputs
        output = super()._generate_and_score_completions(inputs)
        episodes = settled_episodes(self.environments)  # TRL's tool-calling loop ran them (rollout.tool_calling=native)
        for row, episode in zip(inputs, episodes or [], strict=False):
            row.update(episode.fields())
        if self.args.advantage_estimator != TRL_ADVANTAGES:
            self._replace_advantages(len(inputs), output)
        turn_signal = self._credit_turns(inputs, output) if self.args.turn_credit == "discounted_return" else None
        scored = self.wants_scored_batch or self.args.zero_variance_groups is not ZeroVarianceGroups.keep
        batch = self._scored_batch(inputs, output) if scored else None  # before the loss mask: lengths count all
        if self.wants_scored_batch:
            self.after_scoring(batch)
        mask = self.loss_token_mask(inputs, output["completion_ids"], output["completion_mask"])
        mask_loss_tokens(output, mask, lambda count: self.accelerator.gather(count).sum())
        self._record(self.mismatch.against_trainer(output, self))  # grpo_exp.trainer.mismatch
        if batch is None:
            return output, None
        no_spread = no_spread_groups(batch)
        return output, no_spread if turn_signal is None else no_spread & ~turn_signal

    def _credit_turns(self, inputs: list[dict], output: dict) -> torch.Tensor:
        """rollout.turn_credit=discounted_return (grpo_exp.trainer.turn_credit): this process's rows' advantages per
        token in place of TRL's per completion. Returns which groups have a turn advantage that is not zero."""
        turns = gather_object([(row["turn_rewards"], row["turn_tokens"]) for row in inputs])
        names = list(self.reward_func_names)
        weight = float(self.reward_weights[names.index(ENVIRONMENT)]) if ENVIRONMENT in names else 1.0
        policy_mask = (output["completion_mask"] * output.get("tool_mask", 1)).cpu()
        totals, first = self._total_reward(self._logged_rewards()), self.accelerator.process_index * len(inputs)
        own, advantages = credit_batch(
            inputs,
            turns,
            totals,
            policy_mask,
            first=first,
            step_weight=weight,
            group_size=self.num_generations,
            scale=self.scale_rewards,
            discount=self.args.turn_discount,
        )
        output["advantages"] = own.to(output["advantages"].device)
        self.log_advantages([row_turns[0] for row_turns in advantages])  # each trajectory's first turn's
        self._record(turn_advantage_means(advantages))
        return groups_with_turn_signal(advantages, self.num_generations)

    def _replace_advantages(self, rows: int, output: dict) -> None:
        """The `algorithm` estimator's advantages (grpo_exp.trainer.advantages) in place of TRL's, from the reward
        TRL normalised (every process's rows, as TRL logged them: each process computes the same, no collective
        call): this process's `rows` rows (TRL's slice) in the batch TRL trains on, all of them in TRL's logs."""
        total, args = self._total_reward(self._logged_rewards()), self.args
        advantages = estimate(args.advantage_estimator, total, self.num_generations, **args.advantage_settings)
        first = self.accelerator.process_index * rows
        output["advantages"] = advantages[first : first + rows].to(output["advantages"])
        self.log_advantages(advantages.tolist())

    def _compute_loss(self, model, inputs):
        """TRL's loss, or a per-token loss of ours in its place (trainer.loss_type=module:name: trainer.losses)."""
        if self.args.policy_loss is None:
            return super()._compute_loss(model, self.mismatch.weighted(inputs, self.loss_type))
        forward = functools.partial(self.per_token_logps, model, compute_entropy=True)
        reduce_sum = functools.partial(self.accelerator.reduce, reduction="sum")
        epsilons, processes = (self.epsilon_low, self.epsilon_high), self.accelerator.num_processes
        loss, metrics = policy_loss(self.args.policy_loss, inputs, forward, epsilons, self.beta, processes, reduce_sum)
        self._record(metrics)
        return loss
