"""The sampler/trainer mismatch (trainer.mismatch_*), as pure functions: how far the log-probabilities of what
sampled a batch (TRL's generate(), the sampling copy, the multi-turn rollout, vLLM) are from the trainer's own
forward, and TRL's importance-sampling corrections for it, on every path.

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

import torch
from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.schema import MismatchCorrection

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
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"{correction} is not a weighting correction")


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
