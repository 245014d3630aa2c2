"""The sampler/trainer mismatch's statistics (pure functions of log-probabilities): the importance weights of TRL's
corrections, the advantages they weight, and the per-process sums (gathered across processes, then made metrics) of
the mismatch, of how off-policy a batch is, of a stale batch's split into the policy's move and the numerics, and of
the float64 reference. grpo_exp.trainer.mismatch applies them to a trainer's batches."""

import math

import torch

from grpo_exp.schema import MismatchCorrection

WEIGHTING = tuple(correction for correction in MismatchCorrection if correction.weighs)
SEQUENCE_LEVEL = (MismatchCorrection.sequence_truncate, MismatchCorrection.sequence_mask)
PREFIX = "sampling/"


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
