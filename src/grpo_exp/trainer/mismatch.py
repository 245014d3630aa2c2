"""The sampler/trainer mismatch (trainer.mismatch_*, float64_reference_*), in one place: how far the log-probabilities
of what sampled a batch (TRL's generate(), the sampling copy, the multi-turn rollout, vLLM) are from the trainer's own
forward, TRL's importance-sampling corrections for it on every path, the metrics, and its settings' rules. The pure
functions first; then one trainer's watch (MismatchWatch), which the seam calls where TRL's flow needs it: after a
batch is scored (against_trainer) and in the loss (weighted). It reads TRL's state only through TRLSurface's readers.

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

import math
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.schema import MismatchCorrection
from grpo_exp.token_log_probs import token_log_probs
from grpo_exp.trainer.sampling_copy import SamplingCopy
from grpo_exp.trainer.trl_batch import loss_mask

WEIGHTING = tuple(correction for correction in MismatchCorrection if correction.weighs)
SEQUENCE_LEVEL = (MismatchCorrection.sequence_truncate, MismatchCorrection.sequence_mask)
PREFIX = "sampling/"


def resolved_correction(asked: MismatchCorrection | None, bfloat16_copy: bool) -> MismatchCorrection:
    """trainer.mismatch_correction; null: the path's own (the bfloat16 copy: behaviour_ratio; otherwise none)."""
    if asked is not None:
        return asked
    return MismatchCorrection.behaviour_ratio if bfloat16_copy else MismatchCorrection.none


def importance_weights(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    correction: MismatchCorrection,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL's importance weights, [B, T] per token or [B, 1] per sequence. A token whose sampler log-probability is
    NaN (unknown) weighs as the trainer's (difference 0), as in TRL."""
    difference = torch.nan_to_num((trainer_logps - sampler_logps) * mask, nan=0.0)
    if correction in SEQUENCE_LEVEL:
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    if correction in (MismatchCorrection.token_truncate, MismatchCorrection.sequence_truncate):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if correction in (MismatchCorrection.token_mask, MismatchCorrection.sequence_mask):
        return ratio.masked_fill(outside_bounds(ratio, clip_min, clip_max), 0.0)
    raise ValueError(f"{correction} is not a weighting correction")


def outside_bounds(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """Which ratios fall outside [clip_min, clip_max] (None: unbounded on that side)."""
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return (ratio < low) | (ratio > high)


def weighted_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's advantage times its weight ([B] or [B, T] advantages; [B, T] or [B, 1] weights)."""
    return (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * weights.to(advantages)


# Per process: the sums that make the metrics once added (or min/max-ed) over processes.
SUMS = ("tokens", "difference_sum", "difference_max", "k3_sum", "ratios", "ratio_sum", "ratio_min", "ratio_max")


def mismatch_sums(
    trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """[len(SUMS)] of this process's batch; `weights`: the correction's (None: the per-token ratio)."""
    counted = mask.bool() & ~torch.isnan(sampler_logps)
    log_ratio = (trainer_logps - sampler_logps)[counted].double()
    difference = log_ratio.abs()
    k3 = torch.expm1(log_ratio) - log_ratio
    if weights is None:
        ratios = torch.exp(log_ratio)
    elif weights.shape[1] == 1:  # per sequence: the sequences with a counted token
        ratios = weights[counted.any(dim=1)].flatten().double()
    else:
        ratios = weights[counted].double()
    return torch.tensor(
        [
            float(difference.numel()),
            float(difference.sum()),
            float(difference.max()) if difference.numel() else -math.inf,
            float(k3.sum()),
            float(ratios.numel()),
            float(ratios.sum()),
            float(ratios.min()) if ratios.numel() else math.inf,
            float(ratios.max()) if ratios.numel() else -math.inf,
        ],
        dtype=torch.float64,
    )


def mismatch_metrics(sums: torch.Tensor) -> dict[str, float]:
    """The metrics of every process's sums ([processes, len(SUMS)]); none where no token was counted."""
    s = dict(zip(SUMS, sums.T, strict=True))
    tokens, ratios = float(s["tokens"].sum()), float(s["ratios"].sum())
    if not tokens:
        return {}
    return {
        f"{PREFIX}sampling_logp_difference/mean": float(s["difference_sum"].sum()) / tokens,
        f"{PREFIX}sampling_logp_difference/max": float(s["difference_max"].max()),
        f"{PREFIX}mismatch_kl": float(s["k3_sum"].sum()) / tokens,
        f"{PREFIX}importance_sampling_ratio/min": float(s["ratio_min"].min()),
        f"{PREFIX}importance_sampling_ratio/mean": float(s["ratio_sum"].sum()) / max(ratios, 1.0),
        f"{PREFIX}importance_sampling_ratio/max": float(s["ratio_max"].max()),
    }


# ---- how off-policy a batch is: the effective sample size of its importance ratios, and what the correction cuts ----

OFF_POLICY_SUMS = ("units", "ratio_sum", "ratio_square_sum", "outside")
LOG_RATIO_LIMIT = 50.0  # a sequence's summed log-ratio can overflow exp(); the ESS of such a batch is ~0 either way


def off_policy_sums(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    sequence_level: bool,
    bounds: tuple[float | None, float | None] | None,
) -> torch.Tensor:
    """[len(OFF_POLICY_SUMS)] of this process's batch: the raw ratios p_trainer / p_sampler (per token, or per
    sequence for a sequence-level correction), their sum and sum of squares, and how many fall outside `bounds` (the
    correction's [clip_min, clip_max], where it truncates or masks; None: no correction, nothing counted)."""
    counted = mask.bool() & ~torch.isnan(sampler_logps)
    log_ratio = torch.where(counted, trainer_logps - sampler_logps, 0.0).double()
    if sequence_level:
        log_ratio = log_ratio.sum(dim=1)[counted.any(dim=1)]
    else:
        log_ratio = log_ratio[counted]
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    outside = 0.0 if bounds is None else float(outside_bounds(ratio, *bounds).sum())
    return torch.tensor(
        [float(ratio.numel()), float(ratio.sum()), float((ratio * ratio).sum()), outside], dtype=torch.float64
    )


def off_policy_metrics(sums: torch.Tensor, counts_outside: bool) -> dict[str, float]:
    """Over every process's sums ([processes, 4]): the effective sample size of the importance ratios as a fraction
    of the tokens (or sequences), (sum w)^2 / (n sum w^2), 1 on-policy and falling as the batch's policy drifts from
    the trainer's (Kish); and, where a correction truncates or masks, the fraction it truncated or masked."""
    units, total, squares, outside = (float(column.sum()) for column in sums.T)
    if not units or not squares:
        return {}
    metrics = {f"{PREFIX}importance_sampling_ess_fraction": total * total / (units * squares)}
    if counts_outside:
        metrics[f"{PREFIX}importance_sampling_clipped_fraction"] = outside / units
    return metrics


# ---- generation ahead: how much of a stale batch's difference is staleness, how much numerics ----------------------

SPLIT_PREFIX = "async/"


def staleness_split_sums(
    trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, current_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """[tokens, staleness sum, numerics sum] of this process's stale batch: `current_logps` are the sampler's (the
    server's) log-probabilities of the same tokens under the trainer's weights, so |current - sampler| is the
    policy's move since the batch was made (same numerics) and |trainer - current| the numerical part (same
    weights); NaN where a token was not scored again."""
    counted = mask.bool() & ~torch.isnan(sampler_logps) & ~torch.isnan(current_logps)
    staleness = (current_logps - sampler_logps)[counted].double().abs()
    numerics = (trainer_logps - current_logps)[counted].double().abs()
    return torch.tensor([float(staleness.numel()), float(staleness.sum()), float(numerics.sum())], dtype=torch.float64)


def staleness_split_metrics(sums: torch.Tensor) -> dict[str, float]:
    """The mean |log-probability difference| per token of each part, over every process's sums ([processes, 3])."""
    tokens = float(sums[:, 0].sum())
    if not tokens:
        return {}
    return {
        f"{SPLIT_PREFIX}staleness_logp_difference/mean": float(sums[:, 1].sum()) / tokens,
        f"{SPLIT_PREFIX}numerics_logp_difference/mean": float(sums[:, 2].sum()) / tokens,
    }


# ---- the float64 reference: does the sampler disagree with the trainer, or do both round away from the model? ----

REFERENCE_SUMS = ("tokens", "sampler_sum", "sampler_max", "trainer_sum", "trainer_max")


def reference_sums(
    trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, exact_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """[len(REFERENCE_SUMS)]: how far the sampler's and the trainer's log-probabilities are from the float64
    model's (`exact_logps`), over the counted tokens of the sampled rows."""
    counted = mask.bool() & ~torch.isnan(sampler_logps)
    exact = exact_logps[counted].double()
    sampler = (sampler_logps[counted].double() - exact).abs()
    trainer = (trainer_logps[counted].double() - exact).abs()
    empty = not sampler.numel()
    return torch.tensor(
        [
            float(sampler.numel()),
            float(sampler.sum()),
            -math.inf if empty else float(sampler.max()),
            float(trainer.sum()),
            -math.inf if empty else float(trainer.max()),
        ],
        dtype=torch.float64,
    )


def reference_metrics(sums: torch.Tensor) -> dict[str, float]:
    s = dict(zip(REFERENCE_SUMS, sums.T, strict=True))
    tokens = float(s["tokens"].sum())
    if not tokens:
        return {}
    return {
        f"{PREFIX}float64/sampler_logp_difference/mean": float(s["sampler_sum"].sum()) / tokens,
        f"{PREFIX}float64/sampler_logp_difference/max": float(s["sampler_max"].max()),
        f"{PREFIX}float64/trainer_logp_difference/mean": float(s["trainer_sum"].sum()) / tokens,
        f"{PREFIX}float64/trainer_logp_difference/max": float(s["trainer_max"].max()),
    }


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


def vllm_fields(trainer_cfg) -> dict:
    """GRPOConfig's vllm_importance_sampling_* for an explicit trainer.mismatch_correction with vLLM (TRL corrects)."""
    correction = trainer_cfg.mismatch_correction
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
    correction = cfg.trainer.mismatch_correction
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
        lambda cfg: cfg.trainer.mismatch_correction is not None and cfg.trainer.mismatch_correction.weighs,
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
