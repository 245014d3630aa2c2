"""DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13): a length penalty in tokens that
starts `cache_tokens` before the completion limit and reaches -1 at it,

    0                                   |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache     L_max - L_cache < |y| <= L_max
    -1                                  L_max < |y|

with L_max the trainer's max_completion_length (TRL cuts completions there, so -1 is reached by the cut ones).
Added to the correctness reward, it tells a long answer from a cut one smoothly, where overlong filtering only
leaves cut ones out."""

from dataclasses import dataclass

from omegaconf import MISSING, DictConfig

from grpo_exp.errors import UserError
from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import knob


def overlong_penalty(length: int, max_tokens: int, cache_tokens: int) -> float:
    """The penalty of a completion of `length` tokens. Pure."""
    free = max_tokens - cache_tokens
    if length <= free:
        return 0.0
    if length <= max_tokens:
        return (free - length) / cache_tokens
    return -1.0


def cache_size(cache_tokens: int | None, max_completion_length: int) -> int:
    """reward.components.overlong.cache_tokens, checked against the limit (null: a fifth of it)."""
    if cache_tokens is None:
        return max(1, max_completion_length // 5)
    if cache_tokens > max_completion_length:
        raise UserError(
            f"reward.components.overlong.cache_tokens={cache_tokens} is longer than "
            f"trainer.max_completion_length={max_completion_length}: the penalty starts that many tokens before the "
            "limit, so it must fit under it"
        )
    return cache_tokens


@dataclass
class OverlongReward:
    # DAPO's soft overlong punishment (tokens): 0 up to cache_tokens before trainer.max_completion_length, falling
    # linearly to -1 at it. null: a fifth of max_completion_length (the paper's 4096 of 20480)
    weight: float = MISSING
    cache_tokens: int | None = knob(None, ge=1)


def _check_in_run(settings: DictConfig, cfg: DictConfig, processes: int) -> None:
    cache_size(settings.cache_tokens, cfg.trainer.max_completion_length)


@reward_component("overlong", OverlongReward, check=_check_in_run)
def make_overlong_reward(cache_tokens: int | None, max_completion_length: int):
    cache_tokens = cache_size(cache_tokens, max_completion_length)

    def overlong(completions, completion_ids, **kwargs) -> list[float]:
        """0 up to cache_tokens before max_completion_length, falling linearly to -1 at it (tokens)."""
        return [overlong_penalty(len(ids), max_completion_length, cache_tokens) for ids in completion_ids]

    return overlong
