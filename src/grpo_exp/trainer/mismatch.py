"""The sampler/trainer mismatch (trainer.mismatch_*, float64_reference_*), in one place: how far the log-probabilities
of what sampled a batch (TRL's generate(), the sampling copy, the multi-turn rollout, vLLM) are from the trainer's own
forward, TRL's importance-sampling corrections for it on every path, the metrics, and its settings' rules. The
statistics are pure functions (grpo_exp.trainer.mismatch_stats); here, the settings' rules and one trainer's watch
(MismatchWatch), which the seam calls where TRL's flow needs it: after a batch is scored (against_trainer) and in the
loss (weighted). It reads TRL's state only through TRLSurface's readers.

Where TRL corrects itself (vLLM with vllm_importance_sampling_correction) it measures too, under the same names, and
the watch stands aside but for the float64 reference.

Metrics under TRL's names for vLLM, so that dashboards match: sampling/sampling_logp_difference/{mean,max} (|log p
of the trainer - log p of the sampler| over the loss's tokens) and sampling/importance_sampling_ratio/{min,mean,max}
(the weights the loss applies, or, without a weighting correction, p_trainer / p_sampler per token). And a KL
estimate, sampling/mismatch_kl: Schulman's k3, r - 1 - log r with r = p_trainer / p_sampler, whose mean over tokens
drawn from the sampler is KL(sampler || trainer) per token, unbiased and never negative.

The weighting corrections are TRL's (GRPOTrainer, vllm_importance_sampling_mode): the weight of a token is
exp(log p_trainer - log p_sampler), or of a sequence exp of the sum over its tokens, clamped to [clip_min, clip_max]
(`*_truncate`) or set to 0 outside it (`*_mask`). TRL multiplies each token's policy loss by it; for TRL's loss types
other than vespo that loss is a positive multiple of the advantage, so multiplying the advantage instead
(weighted_advantages) is the same loss, and works on every path.
"""

from collections.abc import Callable

import torch
from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.schema import MismatchCorrection
from grpo_exp.token_log_probs import token_log_probs
from grpo_exp.trainer.mismatch_stats import (
    SEQUENCE_LEVEL,
    WEIGHTING,
    importance_weights,
    mismatch_metrics,
    mismatch_sums,
    off_policy_metrics,
    off_policy_sums,
    reference_metrics,
    reference_sums,
    staleness_split_metrics,
    staleness_split_sums,
    weighted_advantages,
)
from grpo_exp.trainer.sampling_copy import SamplingCopy
from grpo_exp.trainer.trl_batch import loss_mask


def resolved_correction(asked: MismatchCorrection | None, bfloat16_copy: bool) -> MismatchCorrection:
    """trainer.mismatch_correction; null: the path's own (the bfloat16 copy: behaviour_ratio; otherwise none)."""
    if asked is not None:
        return asked
    return MismatchCorrection.behaviour_ratio if bfloat16_copy else MismatchCorrection.none


# ---- rules on the knobs, before any model loads -------------------------------------------------------------------

VLLM_FIELDS = (
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)


def check_mismatch(trainer_cfg, *, use_vllm: bool, use_transformers_paged: bool, sharded: bool, loss_type: str) -> None:
    """trainer.mismatch_* and float64_reference_* against the generation path (UserError naming the keys)."""
    correction, extra = trainer_cfg.mismatch_correction, trainer_cfg.extra
    named = f"trainer.mismatch_correction={correction.value}" if correction is not None else ""
    if use_transformers_paged:
        asked = [
            key
            for key, on in (
                ("trainer.mismatch_metrics=true", trainer_cfg.mismatch_metrics),
                (named, correction not in (None, MismatchCorrection.none)),
                ("trainer.float64_reference_every", trainer_cfg.float64_reference_every),
            )
            if on
        ]
        if asked:
            raise UserError(
                f"{asked[0]} needs the sampler's log-probability of each token, which continuous batching "
                "(trainer.extra.use_transformers_paged=true) does not give: use generation=transformers"
            )
    if trainer_cfg.float64_reference_every and sharded:
        raise UserError(
            "trainer.float64_reference_every copies the policy whole in float64: not under DeepSpeed or FSDP (each "
            "process holds a shard); set trainer.float64_reference_every=0"
        )
    low, high = trainer_cfg.mismatch_clip_min, trainer_cfg.mismatch_clip_max
    if low is not None and high is not None and low > high:
        raise UserError(f"trainer.mismatch_clip_min={low} is above trainer.mismatch_clip_max={high}")
    if use_vllm and correction is not None:
        if correction is MismatchCorrection.behaviour_ratio:
            raise UserError(
                f"{named}: with vLLM (trainer.extra.use_vllm=true) TRL's own correction serves: none, token_truncate, "
                "token_mask, sequence_truncate or sequence_mask"
            )
        given = [key for key in VLLM_FIELDS if key in extra]
        if given:
            raise UserError(f"{named} sets TRL's trainer.extra.{given[0]} with vLLM: set one of the two, not both")
    if loss_type == "vespo" and correction in SEQUENCE_LEVEL:
        raise UserError(
            f"{named}: trainer.loss_type=vespo weighs sequences itself and takes token-level weights only "
            "(token_truncate or token_mask), as TRL requires with vLLM"
        )


# Generation ahead's correction when none is asked: staleness 1 ended closest to synchronous under it (from the mean
# of two synchronous runs: -0.010 over 5 seeds, +0.001 over 7; -0.036 over 5 under TRL's sequence_mask; BENCHMARKS.md).
AHEAD_CORRECTION = MismatchCorrection.token_truncate


def asked_correction(trainer_cfg) -> MismatchCorrection | None:
    """trainer.mismatch_correction; where null, AHEAD_CORRECTION for generation ahead (max_staleness of 1 or more)
    unless TRL's own vllm_importance_sampling_* keys are given in trainer.extra; otherwise null (the path's own)."""
    correction = trainer_cfg.mismatch_correction
    ahead = (trainer_cfg.get("max_staleness") or 0) > 0
    if correction is None and ahead and not any(key in trainer_cfg.extra for key in VLLM_FIELDS):
        return AHEAD_CORRECTION
    return correction


def vllm_fields(trainer_cfg) -> dict:
    """GRPOConfig's vllm_importance_sampling_* for the correction asked with vLLM (TRL corrects; asked_correction)."""
    correction = asked_correction(trainer_cfg)
    if correction is None:
        return {}
    if correction is MismatchCorrection.none:
        return {"vllm_importance_sampling_correction": False}
    return {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": correction.value,
        "vllm_importance_sampling_clip_min": trainer_cfg.mismatch_clip_min,
        "vllm_importance_sampling_clip_max": trainer_cfg.mismatch_clip_max,
    }


def _correction(cfg: DictConfig) -> str:
    correction = asked_correction(cfg.trainer)
    return "null (the path's own)" if correction is None else correction.value


# ---- one trainer's watch (trainer.mismatch_*, float64_reference_*) ----------------------------------------------


def completion_sequences(output: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """What the trainer's loss forward reads of TRL's generation batch: the ids and attention mask of prompt and
    completion together, and how many positions (the completion's) to keep."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    return ids, attention, output["completion_ids"].size(1)


Gather = Callable[[torch.Tensor], torch.Tensor]  # [n] of this process -> [processes, n] (a collective)


class MismatchWatch:
    def __init__(self, args, *, use_vllm: bool, trl_corrects: bool):
        """`args`: the GRPOExpConfig; `trl_corrects`: TRL measures and corrects itself (vLLM)."""
        self.stands_aside = trl_corrects
        self.paged = bool(args.use_transformers_paged)
        self.metrics_asked = args.mismatch_metrics
        # vLLM: an explicit correction became TRL's own vllm_importance_sampling_* (grpo_exp.trainer.config)
        self.correction_asked = None if use_vllm else args.mismatch_correction
        self.bfloat16_generation = args.bfloat16_generation and not use_vllm
        self.bfloat16_copy = self.bfloat16_generation  # until the policy's dtype is seen (see_policy)
        self.clip = (args.mismatch_clip_min, args.mismatch_clip_max)
        self.every, self.completions = args.float64_reference_every, args.float64_reference_completions
        self.exact: SamplingCopy | None = None  # the float64 copy, made at its first use
        # the correction TRL applies on vLLM (its vllm_importance_sampling_*), for the off-policy metrics
        self.trl_correction = (
            (MismatchCorrection(args.vllm_importance_sampling_mode), (args.vllm_importance_sampling_clip_min,
             args.vllm_importance_sampling_clip_max)) if trl_corrects else None
        )  # fmt: skip

    def see_policy(self, dtype: torch.dtype) -> None:
        """The policy's dtype: a bfloat16 policy samples itself, with no copy to correct for."""
        self.bfloat16_copy = self.bfloat16_generation and dtype != torch.bfloat16

    @property
    def measure(self) -> bool:
        """auto: measured where a bfloat16 copy samples a policy of another dtype; the float32 paths sample the
        policy's own distribution, 1e-5 apart (experiments/README.md), for one more forward per step."""
        asked = self.metrics_asked if self.metrics_asked is not None else self.bfloat16_copy
        return bool(asked) and not self.paged and not self.stands_aside

    @property
    def correction(self) -> MismatchCorrection:
        return resolved_correction(self.correction_asked, self.bfloat16_copy)

    @property
    def wants_sampler_log_probs(self) -> bool:
        """Whether the sampler must return its log-probabilities (TRL's generate() and the float32 copy return none
        unless asked)."""
        corrects = not self.stands_aside and self.correction is not MismatchCorrection.none
        return self.measure or corrects or bool(self.every)

    def wants_trainer_log_probs(self, output: dict, step: int) -> bool:
        """Whether this batch needs the trainer's own log-probabilities (one forward without gradient, where TRL
        has not made it): to measure, to weight, or for the float64 reference."""
        if output.get("sampling_per_token_logps") is None:
            return False
        corrects = not self.stands_aside and self.correction in WEIGHTING
        return self.measure or corrects or self._reference_due(step)

    def _reference_due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def apply(
        self, output: dict, trainer_logps: torch.Tensor | None, step: int, gather: Gather, policy, temperature: float
    ) -> dict[str, float]:
        """The correction put into TRL's batch (`output`); the metrics to record. `trainer_logps`: None where
        wants_trainer_log_probs said no."""
        sampler = output.get("sampling_per_token_logps")
        if sampler is None:
            return {}
        mask = loss_mask(output)
        weights = None
        if self.stands_aside:
            pass
        elif self.correction in WEIGHTING:
            weights = importance_weights(trainer_logps, sampler, mask, self.correction, *self.clip)
            output["importance_sampling_ratio"] = weights  # TRL's key; the seam's loss applies it
        elif self.correction is MismatchCorrection.behaviour_ratio:
            output["old_per_token_logps"] = sampler
        metrics = {}
        if self.measure:
            metrics |= mismatch_metrics(gather(mismatch_sums(trainer_logps, sampler, mask, weights)))
        if self._reference_due(step):
            exact = self._float64_log_probs(output, policy, step, temperature)
            rows = slice(0, exact.shape[0])
            sums = reference_sums(trainer_logps[rows], sampler[rows], exact, mask[rows])
            metrics |= reference_metrics(gather(sums))
        return metrics

    def against_trainer(self, output: dict, trainer) -> dict[str, float]:
        """The sampler's log-probabilities against the trainer's own, for one generation batch: the correction put
        into `output`, the metrics to record. `trainer`: TRLSurface's reads of TRL's state (its forward without
        gradient, a gather, the policy, the step); the forward runs only where TRL has not made it itself
        (old_per_token_logps) and this watch asks for it, or a stale batch was scored again (generation ahead)."""
        step = trainer.state.global_step
        current = trainer.current_sampler_log_probs(output)  # a stale batch scored again under the trainer's weights
        trainer_logps = None
        if self.wants_trainer_log_probs(output, step) or current is not None:
            trainer_logps = output.get("old_per_token_logps")  # TRL's own forward, where it made one
            if trainer_logps is None:
                trainer_logps = trainer.trainer_log_probs(output)
        metrics = self.off_policy(output, trainer_logps, trainer.gather_sums)
        metrics |= self.apply(output, trainer_logps, step, trainer.gather_sums, trainer.policy, trainer.temperature)
        if current is not None:
            sampler = output["sampling_per_token_logps"]
            sums = staleness_split_sums(trainer_logps, sampler, current.to(sampler.device), loss_mask(output))
            metrics |= staleness_split_metrics(trainer.gather_sums(sums))
        return metrics

    def off_policy(self, output: dict, trainer_logps: torch.Tensor | None, gather: Gather) -> dict[str, float]:
        """The batch's off-policy metrics (off_policy_metrics), where both log-probabilities are at hand: the
        sampler's and the trainer's (this watch's forward, or TRL's own where it corrects). Before `apply`, which may
        put the sampler's in old_per_token_logps."""
        sampler = output.get("sampling_per_token_logps")
        if trainer_logps is None:
            trainer_logps = output.get("old_per_token_logps")
        if sampler is None or trainer_logps is None:
            return {}
        correction, bounds = self.trl_correction or (self.correction, self.clip)
        weighs = correction in WEIGHTING
        sums = off_policy_sums(
            trainer_logps, sampler, loss_mask(output), correction in SEQUENCE_LEVEL, bounds if weighs else None
        )
        return off_policy_metrics(gather(sums), counts_outside=weighs)

    def weighted(self, inputs: dict, loss_type: str) -> dict:
        """TRL applies the importance weights (its importance_sampling_ratio) on vLLM only: elsewhere the same loss,
        through the advantages (vespo weighs by them its own way)."""
        weights = inputs.get("importance_sampling_ratio")
        if weights is None or self.stands_aside or loss_type == "vespo":
            return inputs
        return {**inputs, "advantages": weighted_advantages(inputs["advantages"], weights)}

    @torch.no_grad()
    def _float64_log_probs(self, output: dict, policy, step: int, temperature: float) -> torch.Tensor:
        """The first `completions` rows' completion tokens scored by a float64 copy of the policy, fed what the
        trainer's forward is fed."""
        if self.exact is None:
            self.exact = SamplingCopy(policy, torch.float64)
        self.exact.sync(policy, step)
        rows = slice(0, self.completions)
        completion_ids = output["completion_ids"][rows]
        ids = torch.cat([output["prompt_ids"][rows], completion_ids], dim=1)
        attention = torch.cat([output["prompt_mask"][rows], output["completion_mask"][rows]], dim=1)
        try:
            return token_log_probs(self.exact.copy, ids, attention, completion_ids, temperature)
        finally:
            self.exact.release()  # twice the policy's size: held only while it scores


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("trainer.mismatch_clip_min", "trainer.mismatch_clip_max"),
        lambda cfg: getattr(asked_correction(cfg.trainer), "weighs", False),
        "by an importance-weighting correction",
        lambda cfg: f"trainer.mismatch_correction={_correction(cfg)} weighs nothing",
        "set trainer.mismatch_correction=token_truncate, token_mask, sequence_truncate or sequence_mask",
    ),
    OnlyWith(
        ("trainer.float64_reference_completions",),
        lambda cfg: cfg.trainer.float64_reference_every > 0,
        "by the float64 reference",
        lambda cfg: "trainer.float64_reference_every=0 takes none",
        "set trainer.float64_reference_every to a number of steps",
    ),
)
