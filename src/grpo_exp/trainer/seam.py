"""The one seam between grpo_exp and TRL's GRPOTrainer internals.

Everything grpo_exp needs of TRL's private state is read here and nowhere else: the batch TRL has just
generated and scored (`_logs`, kept by `_generate_and_score_completions`), the per-component rewards before
TRL aggregates them (`_calculate_rewards`: failed scores imputed), its metric store (`_metrics`),
its checkpointing (`_save_checkpoint`), and what a custom rollout needs (`model_wrapped`,
`generation_kwargs`). TRL is pinned to one minor version (pyproject.toml) and tests/test_trl_contract.py
fails loudly when an upgrade changes any of it, TRL's reward aggregation included.

The trainer subclass (grpo_exp.trainer.trainer) sees two hooks and a typed ScoredBatch, never TRL's state.

Groups with no reward spread (trainer.zero_variance_groups) are handled here too, on TRL's generation batch
(grpo_exp.trainer.trl_batch): `skip` marks their rows so that the loss leaves them out, rescaled so that the
update is TRL's; `resample` generates more batches of fresh prompts until a step has enough groups with spread.
With trainer.shared_prompt_forward, the per-token log-probabilities (the loss forward, and the reference model's)
are computed with each group's prompt read once (grpo_exp.trainer.shared_prompt). With trainer.bfloat16_generation,
TRL's transformers generation samples from a bfloat16 copy of the policy (grpo_exp.trainer.sampling_copy), and
the copy's log-probabilities become TRL's `old_per_token_logps`: the loss's ratio corrects for the copy. With
trainer.fast_generation (CPU), it samples from a copy with prepacked weights and each prompt's prefill shared by
its G completions: in the policy's own dtype, the policy's distribution.
"""

import logging
import math
import platform
import random
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import nanstd

from grpo_exp.errors import UserError
from grpo_exp.masks import additive_mask
from grpo_exp.rollout.multiturn import TRAJECTORY_FIELDS
from grpo_exp.stats import impute_group_means, zero_spread_groups
from grpo_exp.text import completion_text
from grpo_exp.trainer.sampling_copy import SamplingCopy, can_prepack
from grpo_exp.trainer.shared_prompt import pack_groups, packable, unpack
from grpo_exp.trainer.trl_batch import INFORMATIVE, concatenate, loss_scale, select_rows

# An advantage below this is the float noise of equal rewards divided by TRL's std + 1e-4, not a learning signal.
ADVANTAGE_NOISE = 1e-3
log = logging.getLogger(__name__)

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
    - `after_scoring(batch)` receives the ScoredBatch TRL has just produced, when `wants_scored_batch` (every
      generated batch, resampled ones included).
    """

    def __init__(
        self,
        *args,
        zero_variance_groups: str = "keep",
        max_resample_batches: int = 4,
        shared_prompt_forward: bool = False,
        bfloat16_generation: bool = False,
        fast_generation: bool | None = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.zero_variance_groups = zero_variance_groups
        self.max_resample_batches = max_resample_batches
        self.shared_prompt_forward = shared_prompt_forward
        self.bfloat16_generation = bfloat16_generation
        self._sampling_copy = None  # made at the first generation, from the policy as it is then
        sharded = self.is_deepspeed_enabled or self.is_fsdp_enabled
        if bfloat16_generation and sharded and self.accelerator.unwrap_model(self.model).dtype != torch.bfloat16:
            # a copy of sharded parameters would hold this process's shards only (a bfloat16 policy needs no copy)
            raise UserError(
                "trainer.bfloat16_generation copies a float32 policy whole: not under DeepSpeed or FSDP; use "
                "model.dtype=bfloat16, generation=transformers or generation=vllm_colocate there"
            )
        cpu = self.accelerator.device.type == "cpu" and not sharded
        trl_samples_elsewhere = self.use_vllm or self.args.use_transformers_paged
        self._fast_generation_asked = bool(fast_generation)
        if fast_generation is None:  # auto: where it was measured to pay
            fast_generation = cpu and can_prepack() and x86_64() and not trl_samples_elsewhere
            if fast_generation:
                log.info(
                    "generation: a copy of the policy with prepacked weights samples on this CPU, the policy's own "
                    "distribution (trainer.fast_generation=false: TRL's generate() on the policy)"
                )
        self.fast_generation = fast_generation
        if fast_generation and (not cpu or not can_prepack()):
            raise UserError(
                f"trainer.fast_generation (generation=transformers_fast) decodes from a prepacked copy of the whole "
                f"policy on CPU, with torch's oneDNN kernels; this run is on {self.accelerator.device.type}"
                + (" under DeepSpeed/FSDP" if sharded else "")
                + ("" if can_prepack() else ", and this torch build has no oneDNN (mkldnn)")
                + ". Use generation=transformers, or on a GPU generation=vllm_colocate / vllm_server"
            )
        self._said_not_exact = False  # the log says once that skip/resample leave nothing out

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
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        output, no_spread = self._generate_scored(self.before_generation(inputs))
        if self.zero_variance_groups == "resample":
            output, no_spread = self._resample(output, no_spread, len(inputs) // self.num_generations)
        if self.zero_variance_groups != "keep" and self._leaving_out_is_exact():
            rows = no_spread.repeat_interleave(self.num_generations)
            start = self.accelerator.process_index * len(inputs)  # this process's rows of the gathered batch
            output[INFORMATIVE] = ~rows[start : start + len(inputs)].to(output["advantages"].device)
            self.record_metric("zero_variance/groups_left_out", float(no_spread.sum()))
        return output

    def _leaving_out_is_exact(self) -> bool:
        """Whether rows with zero advantages add nothing to the loss: not with a KL term (beta > 0), an entropy
        bonus, a high-entropy token mask or a router loss, which see every row. Then every group trains, as in
        TRL (said once in the log)."""
        exact = self.beta == 0.0 and not self._entropy_bonus_enabled and self.top_entropy_quantile == 1.0
        exact = exact and not self.aux_loss_enabled
        if not exact and not self._said_not_exact:
            log.warning(
                "trainer.zero_variance_groups=%s leaves no group out: with beta > 0 (or an entropy term) "
                "a group without spread still moves the weights, so every group trains as in TRL",
                self.zero_variance_groups,
            )
            self._said_not_exact = True
        return exact

    def _generate_scored(self, inputs: list[dict]) -> tuple[dict, torch.Tensor | None]:
        """TRL's generation and scoring of one batch; the after_scoring hook; the loss_token_mask hook; which
        groups have no spread."""
        output = super()._generate_and_score_completions(inputs)
        batch = None
        if self.wants_scored_batch or self.zero_variance_groups != "keep":
            batch = self._scored_batch(inputs, output)  # before the loss mask: lengths count every generated token
        if self.wants_scored_batch:
            self.after_scoring(batch)
        self._mask_loss_tokens(inputs, output)
        if self.bfloat16_generation and output.get("sampling_per_token_logps") is not None:
            # The bfloat16 copy sampled: it is the behaviour policy that the loss's ratio (and PPO's clip) is
            # taken against, in place of TRL's float32 log-probabilities.
            output["old_per_token_logps"] = output["sampling_per_token_logps"]
        if batch is None:
            return output, None
        # No spread, and advantages that are zero (float noise aside): under normalize_then_sum TRL normalises over
        # the batch, so a group without spread still has equal, non-zero advantages, and it trains.
        zero_advantages = batch.grouped(batch.advantages).abs().amax(dim=1) < ADVANTAGE_NOISE
        return output, zero_spread_groups(batch.grouped(batch.total)) & zero_advantages

    def _mask_loss_tokens(self, inputs: list[dict], output: dict) -> None:
        """The loss_token_mask hook applied to TRL's completion mask, and TRL's token count (the dapo / cispo
        normaliser, gathered over processes) recounted."""
        mask = self.loss_token_mask(inputs, output["completion_ids"], output["completion_mask"])
        if mask is None:
            return
        output["completion_mask"] = output["completion_mask"] * mask.to(output["completion_mask"])
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's single-turn generation; with bfloat16_generation or fast_generation (text prompts, training), from
        the sampling copy. A bfloat16 copy of a float32 policy returns its log-probabilities (where TRL's
        transformers path returns none); a copy in the policy's own dtype samples the policy's distribution."""
        policy = self.accelerator.unwrap_model(self.model)
        dtype = torch.bfloat16 if self.bfloat16_generation else policy.dtype
        # A policy already in the copy's dtype samples exactly as it is: no copy unless it decodes faster.
        copy_samples = self.model.training and (self.fast_generation or dtype != policy.dtype)
        copy_samples = copy_samples and images is None and not multimodal_fields
        if copy_samples and self._sampling_copy is None:
            self._sampling_copy = self._new_sampling_copy(policy, dtype, prompt_ids[0])
        if not copy_samples or self._sampling_copy is None:  # None: auto fast_generation turned itself off
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        with profiling_context(self, "transformers.generate"):
            self._sampling_copy.sync(policy, self.state.global_step)
            return self._sampling_copy.generate(
                prompt_ids, self.generation_config, with_log_probs=dtype != policy.dtype
            )

    def _new_sampling_copy(self, policy, dtype: torch.dtype, probe: list[int]) -> SamplingCopy | None:
        """The sampling copy; a prepacked one must reproduce the policy's logits on `probe` (a prompt). Where it does
        not (an architecture whose forward reads a Linear's weight, LoRA layers among them), auto fast_generation
        turns itself off with a warning, and an explicit one is refused."""
        if not self.fast_generation:
            return SamplingCopy(policy, dtype)
        try:
            return SamplingCopy(policy, dtype, prepack=True, probe=probe)
        except Exception as err:  # whatever a forward through the replaced layers raised
            why = f"the prepacked copy does not run this model ({type(err).__name__}: {err})"
            if self._fast_generation_asked:
                raise UserError(f"trainer.fast_generation=true: {why}; use trainer.fast_generation=false") from err
            log.warning("trainer.fast_generation (auto) is off: %s; TRL's generate() samples", why)
            self.fast_generation = False
            return SamplingCopy(policy, dtype) if dtype != policy.dtype else None

    def _resample(self, output: dict, no_spread: torch.Tensor, groups: int) -> tuple[dict, torch.Tensor]:
        """DAPO's dynamic sampling: more batches of fresh prompts (at most max_resample_batches) until `groups`
        groups have a spread; the step trains on those, topped up with no-spread groups if the bound was hit."""
        batches = [(output, no_spread)]
        with_spread = int((~no_spread).sum())
        while with_spread < groups and len(batches) <= self.max_resample_batches:
            batches.append(self._generate_scored(self._fresh_inputs(groups, attempt=len(batches))))
            with_spread += int((~batches[-1][1]).sum())
        every_group = [(bool(flags[g]), b, g) for b, (_, flags) in enumerate(batches) for g in range(len(flags))]
        ranked = sorted(every_group)[:groups]  # groups with spread first, each in the order generated
        size = self.num_generations
        parts, chosen_flags = [], []
        for b, (batch, flags) in enumerate(batches):
            chosen = [g for _, batch_no, g in ranked if batch_no == b]
            if chosen:
                rows = torch.tensor([g * size + i for g in chosen for i in range(size)])
                parts.append(select_rows(batch, rows))
                chosen_flags.extend(bool(flags[g]) for g in chosen)
        self.record_metric("resample/batches", float(len(batches)))
        self.record_metric("resample/groups_dropped", float(sum(len(flags) for _, flags in batches) - groups))
        self.record_metric("resample/bound_hit", float(with_spread < groups))
        return concatenate(parts, self.processing_class.pad_token_id), torch.tensor(chosen_flags)

    def _fresh_inputs(self, groups: int, attempt: int) -> list[dict]:
        """`groups` prompts of the training set, each repeated G times as TRL's sampler gives them; drawn from the
        seed, the step and the attempt, so a resumed run draws the same ones."""
        dataset = self.train_dataset
        rng = random.Random(f"{self.args.seed}/{self.state.global_step}/{attempt}")
        indices = range(len(dataset))
        drawn = rng.sample(indices, groups) if len(dataset) >= groups else rng.choices(indices, k=groups)
        return [dataset[i] for i in drawn for _ in range(self.num_generations)]

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's per-token log-probabilities (and entropies) of the completions; with shared_prompt_forward, from
        one packed forward in which each group's prompt is read once (text models with a maskable attention)."""
        unwrapped = self.accelerator.unwrap_model(model)
        packed = None
        if (
            self.shared_prompt_forward
            and not compute_aux_loss
            and packable(unwrapped.config)
            and all(value is None for value in multimodal.values())
        ):
            pad = self.processing_class.pad_token_id
            packed = pack_groups(input_ids.cpu(), attention_mask.cpu(), logits_to_keep, pad)
        if packed is None:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
        device = input_ids.device
        # sdpa takes a boolean mask whatever the compute dtype (autocast); eager adds a float one
        sdpa = unwrapped.config._attn_implementation == "sdpa"
        mask = packed.allowed if sdpa else additive_mask(packed.allowed, unwrapped.dtype)
        with self.accelerator.autocast():
            out = model(
                input_ids=packed.input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=packed.position_ids.to(device),
                shift_labels=packed.shift_labels.to(device),
                fused_lm_head=True,
            )
        entropies = unpack(out.entropy, packed, logits_to_keep) if compute_entropy else None
        return unpack(out.log_probs, packed, logits_to_keep), entropies, None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss; with rows of no-spread groups marked (skip/resample), over the other rows only, rescaled to
        TRL's normalisation: the same update for beta=0, without the forward/backward of the left-out rows."""
        keep = inputs.get(INFORMATIVE)
        if keep is None or bool(keep.all()):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not keep.any():
            # TRL's gradient is exactly zero here. Zero gradients rather than none, so that the optimiser takes
            # the same step TRL takes (Adam's moments still move the weights). Several processes (or a sharded
            # model) must all go through the wrapped model's forward and backward: one row there, times 0.
            if self.accelerator.num_processes == 1 and not (self.is_deepspeed_enabled or self.is_fsdp_enabled):
                return sum(p.view(-1)[0] * 0.0 for p in model.parameters() if p.requires_grad)
            return super().compute_loss(model, select_rows(inputs, torch.tensor([0])), return_outputs) * 0.0
        kept = select_rows(inputs, keep.nonzero().squeeze(1))
        loss = super().compute_loss(model, kept, return_outputs, num_items_in_batch)
        return loss * loss_scale(self.loss_type, inputs, keep)

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


def x86_64() -> bool:
    """The CPUs fast_generation was measured on (BENCHMARKS.md); elsewhere it is on only when asked for."""
    return platform.machine().lower() in ("x86_64", "amd64")


def as_rollout_func(rollout):
    """TRL's `rollout_func(prompts, trainer)` for a rollout object with `trl_batch(model, tokenizer, prompts,
    generation_kwargs) -> dict` (grpo_exp.rollout.multiturn.MultiTurnRollout)."""

    def rollout_func(prompts: list, trainer) -> dict:
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            return rollout.trl_batch(model, trainer.processing_class, prompts, trainer.generation_kwargs)

    return rollout_func
