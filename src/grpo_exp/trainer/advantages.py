"""Advantage estimators (the `algorithm` config group): how a generation batch's total rewards become advantages.

Each estimator is a pure function of the total rewards [N] of a whole generation batch (every process's rows,
gathered), in groups of `group_size` consecutive rows (one prompt each), returning advantages [N]. A NaN reward is a
completion no reward component could score; as in TRL 1.16 it is left out of every statistic (group means, batch
statistics, counts) and its own advantage is 0. `grpo` is not here: it is TRL's own computation, which the seam
(grpo_exp.trainer.seam) leaves untouched; the others replace TRL's advantages right after TRL has scored the batch.

`check_algorithm` holds the rules between algorithm.* and the trainer's knobs, checked before any model loads.
"""

import math
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from grpo_exp.errors import UserError
from grpo_exp.schema import AdvantageEstimator, AlgorithmSchema, ScaleRewards, TrainerSchema

# verl's whitening: (x - mean) * rsqrt(var + 1e-8)
WHITEN_EPS = 1e-8


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} are not groups of {group_size}")
    return rewards.float().view(-1, group_size)


def _centred(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward - its group's mean over its scorable rows [P, G] (NaN: unscorable), scorable rows per group [P, 1])."""
    grouped = _grouped(rewards, group_size)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    return grouped - torch.nanmean(grouped, dim=1, keepdim=True), scorable


def dr_grpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): reward - its group's mean, no std division (TRL's advantages
    under scale_rewards=none)."""
    centred, _ = _centred(rewards, group_size)
    return torch.nan_to_num(centred, nan=0.0).view(-1)


def rloo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): reward - the mean of the other rewards of its group, which is
    n/(n-1) * (reward - group mean) with n the group's scorable completions (G when all are); a completion alone in
    its group with a score has no baseline and gets 0."""
    if group_size < 2:
        raise ValueError(f"RLOO needs at least 2 completions per group, not {group_size}")
    centred, n = _centred(rewards, group_size)
    advantages = torch.where(n > 1, centred * n / (n - 1).clamp(min=1), torch.zeros_like(centred))
    return torch.nan_to_num(advantages, nan=0.0).view(-1)


def reinforce_pp_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE++ w/ baseline (Hu et al. 2025, arXiv 2501.03262), as verl's reinforce_plus_plus_baseline: centred =
    reward - its group's mean; then whitened over the whole batch, (centred - mean(centred)) / sqrt(var(centred) +
    1e-8), with verl's unbiased (Bessel-corrected) variance and its epsilon inside the square root. Each completion
    counts once (verl whitens over tokens, weighting completions by length). The batch mean of `centred` is 0 up to
    rounding (every group's centred values sum to 0); it is subtracted as verl does. Fewer than 2 scorable
    completions in the batch: 0."""
    centred, _ = _centred(rewards, group_size)
    scorable = centred[~torch.isnan(centred)]
    if scorable.numel() < 2:
        return torch.zeros(rewards.numel())
    mean, var = scorable.mean(), scorable.var(unbiased=True)
    return torch.nan_to_num((centred - mean) / torch.sqrt(var + WHITEN_EPS), nan=0.0).view(-1)


def pass_at_k(rewards: torch.Tensor, group_size: int, k: int = 2, threshold: float = 0.5) -> torch.Tensor:
    """Pass@k training's analytic advantage (Chen et al. 2025, arXiv 2508.10751). A completion is correct when its
    reward is above `threshold` (strictly). In a group of N scorable completions, N_pos correct, N_neg = N - N_pos:
    R = 1 - C(N_neg, k)/C(N, k) (the group's pass@k), sigma = sqrt(R(1 - R)); a correct completion gets
    (1 - R)/sigma, an incorrect one (1 - R - C(N_neg-1, k-1)/C(N-1, k-1))/sigma. A group with sigma = 0 (all
    correct, all wrong, or N_neg < k, where every k-subset holds a correct one) or with fewer than k scorable
    completions gets 0, as do unscorable completions. k=1 is GRPO's advantage with the population std."""
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k needs 1 <= k <= the group size {group_size}, not k={k}")
    grouped = _grouped(rewards, group_size)
    advantages = torch.zeros_like(grouped, dtype=torch.float64)
    for g, group in enumerate(grouped.tolist()):
        scorable = [r for r in group if not math.isnan(r)]
        n, n_pos = len(scorable), sum(r > threshold for r in scorable)
        n_neg = n - n_pos
        if n < k or n_pos in (0, n):
            continue
        pass_k = 1 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(pass_k * (1 - pass_k))
        if sigma == 0:
            continue
        positive = (1 - pass_k) / sigma
        negative = (1 - pass_k - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma
        for i, r in enumerate(group):
            if not math.isnan(r):
                advantages[g, i] = positive if r > threshold else negative
    return advantages.float().view(-1)


# The estimators that replace TRL's advantages (grpo: TRL's own, so not here).
ESTIMATORS: dict[AdvantageEstimator, Callable[..., torch.Tensor]] = {
    AdvantageEstimator.dr_grpo: dr_grpo,
    AdvantageEstimator.rloo: rloo,
    AdvantageEstimator.reinforce_pp_baseline: reinforce_pp_baseline,
    AdvantageEstimator.pass_at_k: pass_at_k,
}


def estimate(
    name: AdvantageEstimator, rewards: torch.Tensor, group_size: int, *, k: int = 2, threshold: float = 0.5
) -> torch.Tensor:
    """Estimator `name` on a whole batch's total rewards [N] (grouped by `group_size`): advantages [N], float32.
    `k` and `threshold` are pass_at_k's settings (algorithm.k, algorithm.threshold)."""
    if name is AdvantageEstimator.grpo:
        raise ValueError("algorithm=grpo is TRL's own computation: nothing to estimate")
    if name is AdvantageEstimator.pass_at_k:
        return pass_at_k(rewards, group_size, k=k, threshold=threshold)
    return ESTIMATORS[name](rewards, group_size)


# ---- rules between algorithm.* and the trainer, before any model loads ------------------------------------------

PASS_AT_K_SETTINGS = ("k", "threshold")


def check_algorithm(algorithm: DictConfig, trainer_cfg: DictConfig) -> None:
    """algorithm.* against the trainer: no value that the run would ignore, k within the group."""
    name = AdvantageEstimator(algorithm.name)
    if name is not AdvantageEstimator.pass_at_k:
        for key in PASS_AT_K_SETTINGS:
            if algorithm[key] != AlgorithmSchema.__dataclass_fields__[key].default:
                raise UserError(
                    f"algorithm.{key}={algorithm[key]} is a setting of algorithm=pass_at_k, which this run does not "
                    f"use (algorithm={name.value}): leave it out, or use algorithm=pass_at_k"
                )
    if name is AdvantageEstimator.grpo:
        return
    scale = ScaleRewards(trainer_cfg.scale_rewards)
    default = TrainerSchema.__dataclass_fields__["scale_rewards"].default
    if scale is not default:
        raise UserError(
            f"trainer.scale_rewards={scale.value} is TRL's scaling of its advantages, which algorithm={name.value} "
            f"replaces with its own: leave trainer.scale_rewards at its default ({default.value}, then not applied), "
            "or use algorithm=grpo"
        )
    aggregation = trainer_cfg.extra.get("multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        raise UserError(
            f"trainer.extra.multi_objective_aggregation={aggregation} is TRL's own advantage estimator (each "
            f"component normalised in its group, then the batch); algorithm={name.value} works on the summed "
            "reward: use it with sum_then_normalize (the default), or algorithm=grpo"
        )
    if name is AdvantageEstimator.pass_at_k:
        if not algorithm.k <= trainer_cfg.num_generations:
            raise UserError(
                f"algorithm.k={algorithm.k} must be at most trainer.num_generations={trainer_cfg.num_generations} "
                "(pass@k of a group of that many completions): lower algorithm.k or raise trainer.num_generations"
            )
        if not math.isfinite(algorithm.threshold):
            raise UserError(f"algorithm.threshold={algorithm.threshold}: must be a finite number")
