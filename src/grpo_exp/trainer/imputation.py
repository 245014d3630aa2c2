"""A reward component that failed for some members of a group (a judge timeout, a parse failure) gives them the
group's mean (grpo_exp.stats.impute_group_means) in training, so that the failure moves no advantage. Under TRL's
normalize_then_sum a missing value already gets a z-score of 0, so nothing is imputed there."""

import torch

from grpo_exp.stats import impute_group_means


def impute_failures(
    rewards: torch.Tensor, group_size: int, names: list[str], applies: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(rewards [N, components] with failures imputed, which were [N, components] bool on the CPU, the metrics
    rewards/<name>/imputed). `applies`: training under sum_then_normalize; else the rewards as they are."""
    if not applies:
        return rewards, torch.zeros(rewards.shape, dtype=torch.bool), {}
    rewards, imputed = impute_group_means(rewards, group_size)
    metrics = {f"rewards/{name}/imputed": float(imputed[:, i].sum()) for i, name in enumerate(names)}
    return rewards, imputed.cpu(), metrics
