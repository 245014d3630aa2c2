"""Advantage estimators (the `algorithm` config group): how a generation batch's total rewards become advantages.

Each estimator is a pure function of the total rewards [N] of a whole generation batch (every process's rows,
gathered), in groups of `group_size` consecutive rows (one prompt each), returning advantages [N]; its settings are
its keyword parameters, with their defaults (conf/algorithm/<name>.yaml sets them: `algorithm.<setting>`). A NaN
reward is a completion no reward component could score; as in TRL 1.16 it is left out of every statistic (group
means, batch statistics, counts) and its own advantage is 0. `grpo` is registered without a function: it is TRL's
own computation, which the seam (grpo_exp.trainer.seam) leaves untouched; the others replace TRL's advantages right
after TRL has scored the batch.

A new estimator is one function here, registered with `@register_estimator("name")`, and conf/algorithm/<name>.yaml.
Its rules against the trainer's knobs are data on the registration (`requires`: Requirement), checked by
`check_algorithm` before any model loads, as is the estimator itself on a small batch of the run's group size.
"""

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.plugins import import_callable, signature_of
from grpo_exp.registries import add
from grpo_exp.schema import ScaleRewards, TrainerSchema

# verl's whitening: (x - mean) * rsqrt(var + 1e-8)
WHITEN_EPS = 1e-8
# algorithm.name of TRL's own advantages (the default): nothing recomputed.
TRL_ADVANTAGES = "grpo"


@dataclass(frozen=True)
class Requirement:
    """A trainer knob that must keep one value with an estimator: `key` under trainer (dotted: trainer.extra's),
    `value` the one allowed (None: the schema's default); `why`, with {key}, {value}, {required} and {name}."""

    key: str
    why: str
    value: Any = None

    def required(self) -> Any:
        if self.value is not None:
            return self.value
        default = TrainerSchema.__dataclass_fields__[self.key].default
        return getattr(default, "value", default)

    def check(self, name: str, trainer_cfg: DictConfig) -> None:
        *parents, last = self.key.split(".")
        node = trainer_cfg
        for parent in parents:
            node = node[parent]
        value = node.get(last, self.required())
        value = getattr(value, "value", value)
        if value != self.required():
            message = self.why.format(key=f"trainer.{self.key}", value=value, required=self.required(), name=name)
            raise UserError(message)


# What every estimator that replaces TRL's advantages needs (TRL's own scaling and per-component normalisation off).
DEFAULT_SCALE_REWARDS = Requirement(
    "scale_rewards",
    "{key}={value} is TRL's scaling of its advantages, which algorithm={name} replaces with its own: leave {key} at "
    "its default ({required}, then not applied), or use algorithm=grpo",
)
SUM_THEN_NORMALIZE = Requirement(
    "extra.multi_objective_aggregation",
    "{key}={value} is TRL's own advantage estimator (each component normalised in its group, then the batch); "
    "algorithm={name} works on the summed reward: use it with {required} (the default), or algorithm=grpo",
    value="sum_then_normalize",
)
REPLACES_TRL = (DEFAULT_SCALE_REWARDS, SUM_THEN_NORMALIZE)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: `function(rewards [N], group_size, **settings) -> advantages [N]` (None: TRL's own),
    the trainer knobs it requires, and whether it keeps a group's scale (a group's rewards times c give advantages
    times c: reward.components.selfverify.scale_by_pass_rate acts only then)."""

    name: str
    function: Callable[..., torch.Tensor] | None
    requires: tuple[Requirement, ...] = REPLACES_TRL
    keeps_group_scale: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    takes_any_setting: bool = False  # a **kwargs parameter


ESTIMATORS: dict[str, Estimator] = {}


def settings_of(function: Callable) -> dict[str, Any]:
    """An estimator's settings: its parameters after (rewards, group_size), with their defaults."""
    parameters = list(inspect.signature(function).parameters.values())
    first_two = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
    return {
        p.name: p.default
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p not in first_two
    }


def register_estimator(
    name: str, *, requires: tuple[Requirement, ...] = REPLACES_TRL, keeps_group_scale: bool = True
) -> Callable:
    """Decorator: the function is the estimator `name` (algorithm=name), its keyword parameters its settings."""

    def register(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        estimator = Estimator(name, function, requires, keeps_group_scale, settings_of(function))
        add(ESTIMATORS, name, estimator, "an estimator named")
        return function

    return register


# The attribute a user's estimator by import path carries its declarations in (estimator_declares).
DECLARED = "__grpo_exp_estimator__"


def estimator_declares(*, requires: tuple[Requirement, ...] = REPLACES_TRL, keeps_group_scale: bool = True) -> Callable:
    """Decorator for a user's estimator by import path (algorithm.name=module:name): it declares what a built-in's
    @register_estimator does, the trainer knobs it requires and whether it keeps a group's scale, e.g.
    `@estimator_declares(keeps_group_scale=False)` (reward.components.selfverify.scale_by_pass_rate then refused)."""

    def declare(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        setattr(function, DECLARED, {"requires": tuple(requires), "keeps_group_scale": bool(keeps_group_scale)})
        return function

    return declare


# TRL's own advantages: registered for their name and rules (none), computed by TRL.
ESTIMATORS[TRL_ADVANTAGES] = Estimator(TRL_ADVANTAGES, None, requires=())


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} are not groups of {group_size}")
    return rewards.float().view(-1, group_size)


def _centred(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward - its group's mean over its scorable rows [P, G] (NaN: unscorable), scorable rows per group [P, 1])."""
    grouped = _grouped(rewards, group_size)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    return grouped - torch.nanmean(grouped, dim=1, keepdim=True), scorable


@register_estimator("dr_grpo")
def dr_grpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): reward - its group's mean, no std division (TRL's advantages
    under scale_rewards=none)."""
    centred, _ = _centred(rewards, group_size)
    return torch.nan_to_num(centred, nan=0.0).view(-1)


@register_estimator("rloo")
def rloo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): reward - the mean of the other rewards of its group, which is
    n/(n-1) * (reward - group mean) with n the group's scorable completions (G when all are); a completion alone in
    its group with a score has no baseline and gets 0."""
    if group_size < 2:
        raise ValueError(f"RLOO needs at least 2 completions per group, not {group_size}")
    centred, n = _centred(rewards, group_size)
    advantages = torch.where(n > 1, centred * n / (n - 1).clamp(min=1), torch.zeros_like(centred))
    return torch.nan_to_num(advantages, nan=0.0).view(-1)


@register_estimator("reinforce_pp_baseline")
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


@register_estimator("pass_at_k", keeps_group_scale=False)
def pass_at_k(rewards: torch.Tensor, group_size: int, k: int = 2, threshold: float = 0.5) -> torch.Tensor:
    """Pass@k training's analytic advantage (Chen et al. 2025, arXiv 2508.10751). A completion is correct when its
    reward is above `threshold` (strictly). In a group of N scorable completions, N_pos correct, N_neg = N - N_pos:
    R = 1 - C(N_neg, k)/C(N, k) (the group's pass@k), sigma = sqrt(R(1 - R)); a correct completion gets
    (1 - R)/sigma, an incorrect one (1 - R - C(N_neg-1, k-1)/C(N-1, k-1))/sigma. A group with sigma = 0 (all
    correct, all wrong, or N_neg < k, where every k-subset holds a correct one) or with fewer than k scorable
    completions gets 0, as do unscorable completions. k=1 is GRPO's advantage with the population std.
    It does not keep a group's scale: it counts the rewards above the threshold and divides by the group's spread."""
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k needs 1 <= k <= the group size {group_size}, not k={k}")
    if not math.isfinite(threshold):
        raise ValueError(f"the threshold must be a finite number, not {threshold}")
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


CONTRACT = (
    "an estimator is f(rewards, group_size, **settings) -> advantages: rewards a float32 tensor [N] (groups of "
    "group_size consecutive completions; NaN: unscorable), advantages a float tensor [N], finite"
)


def estimator(name: str) -> Estimator:
    """The registered estimator `name`, or the user's by import path (module:name; the current directory is
    importable), which replaces TRL's advantages as ours do; or one UserError listing them."""
    if name in ESTIMATORS:
        return ESTIMATORS[name]
    if ":" not in name and "." not in name:
        raise UserError(
            f"algorithm.name={name}: no such estimator; the registered ones: {', '.join(ESTIMATORS)}; or your own "
            "by import path, module:name"
        )
    return users_estimator(name)


@functools.cache
def users_estimator(path: str) -> Estimator:
    function = import_callable(path, "algorithm.name", "an advantage estimator")
    signature = signature_of(function)
    if signature is not None:
        try:
            signature.bind_partial(None, None)
        except TypeError as err:
            raise UserError(
                f"algorithm.name={path}: cannot be called as {CONTRACT}: {err}; its signature is {signature}"
            ) from None
    takes_any = signature is None or any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    settings = {} if signature is None else settings_of(function)
    declared = getattr(function, DECLARED, {})
    requires = declared.get("requires", REPLACES_TRL)
    if not all(isinstance(requirement, Requirement) for requirement in requires):
        raise UserError(
            f"algorithm.name={path}: its declared requires must be Requirements (grpo_exp.trainer.advantages."
            f"Requirement, e.g. DEFAULT_SCALE_REWARDS), not {requires!r}"
        )
    return Estimator(
        path,
        function,
        requires=requires,
        keeps_group_scale=declared.get("keeps_group_scale", True),
        settings=settings,
        takes_any_setting=takes_any,
    )


def estimate(name: str, rewards: torch.Tensor, group_size: int, **settings) -> torch.Tensor:
    """Estimator `name` on a whole batch's total rewards [N] (grouped by `group_size`), with its `settings`
    (algorithm.<setting>): advantages [N], float32. Its result is checked: one finite number per completion."""
    found = estimator(name)
    if found.function is None:
        raise ValueError(f"algorithm={name} is TRL's own computation: nothing to estimate")
    advantages = found.function(rewards, group_size, **settings)
    where = f"algorithm.name={name}"
    if not isinstance(advantages, torch.Tensor):
        raise UserError(f"{where} returned a {type(advantages).__name__}, not a tensor: {CONTRACT}")
    if tuple(advantages.shape) != tuple(rewards.shape) or not advantages.is_floating_point():
        raise UserError(
            f"{where} returned a {advantages.dtype} tensor of shape {tuple(advantages.shape)} for rewards of shape "
            f"{tuple(rewards.shape)}: {CONTRACT}"
        )
    if not bool(torch.isfinite(advantages).all()):
        raise UserError(f"{where} returned advantages that are not finite (nan or inf): {CONTRACT}")
    return advantages.detach().float().cpu()


def algorithm_settings(algorithm: DictConfig) -> dict[str, Any]:
    """The estimator's settings as the run sets them: every key of the algorithm node but its name."""
    return {key: value for key, value in OmegaConf.to_container(algorithm, resolve=True).items() if key != "name"}


# ---- rules between algorithm.* and the trainer, before any model loads ------------------------------------------


def check_algorithm(algorithm: DictConfig, trainer_cfg: DictConfig) -> None:
    """algorithm.* against the trainer: a known estimator, no setting it does not take, the trainer knobs it
    requires (its registration's `requires`), and the estimator itself on a batch of the run's group size (its own
    refusals of its settings, named)."""
    if algorithm.get("name") is None:
        raise UserError(f"algorithm.name: missing; choose an estimator: algorithm={' | '.join(ESTIMATORS)}")
    name = algorithm.name
    found = estimator(name)
    settings = algorithm_settings(algorithm)
    for key, value in settings.items():
        if key not in found.settings and not found.takes_any_setting:
            takes = ", ".join(found.settings) or "none"
            raise UserError(
                f"algorithm.{key}={value}: algorithm={name} has no setting '{key}' (its settings: {takes}); "
                "leave it out, or choose the estimator that takes it"
            )
        check_setting_type(name, key, value, found.settings.get(key, inspect.Parameter.empty))
    for requirement in found.requires:
        requirement.check(name, trainer_cfg)
    if found.function is not None:
        try_estimator(name, settings, trainer_cfg.num_generations)


def check_setting_type(name: str, key: str, value: Any, default: Any) -> None:
    """A setting of the type of its default, where that is a plain one (an int is a float too)."""
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}.get(type(default))
    if kinds is None or value is None:
        return
    if isinstance(value, kinds) and (isinstance(value, bool) == isinstance(default, bool)):
        return
    raise UserError(
        f"algorithm.{key}={value!r}: algorithm={name} takes {type(default).__name__} for {key} (default {default})"
    )


def try_estimator(name: str, settings: dict, group_size: int) -> None:
    """The estimator on two groups of the run's size, or one UserError: its own refusal of its settings."""
    rewards = torch.tensor([float(i % 2) for i in range(2 * group_size)])
    try:
        estimate(name, rewards, group_size, **settings)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the estimator's refusal (or a user's function failing), in one line
        shown = "".join(f" algorithm.{key}={value}" for key, value in settings.items())
        error = str(err) if name in ESTIMATORS else f"raised {type(err).__name__}: {err}"
        raise UserError(f"algorithm={name}{shown} with trainer.num_generations={group_size}: {error}") from None


def check_keeps_group_scale(algorithm: str, scale_rewards: ScaleRewards, setting: str) -> None:
    """`setting` multiplies a group's rewards by one constant: it acts only where the advantage keeps a group's scale
    (no division by the group's own std, no threshold on the reward). The estimator declares it (keeps_group_scale,
    a user's through @register_estimator)."""
    if algorithm == TRL_ADVANTAGES and scale_rewards is ScaleRewards.group:
        raise UserError(
            f"{setting} scales a group's rewards by one constant, which trainer.scale_rewards=group divides out "
            "again: use trainer.scale_rewards=none or batch with it, or an estimator that keeps it "
            f"(algorithm={', '.join(keeping_group_scale())})"
        )
    if not estimator(algorithm).keeps_group_scale:
        why = (
            ": pass_at_k counts the rewards above algorithm.threshold and divides by the group's spread; scaled, a "
            "right verdict's reward may fall below the threshold"
            if algorithm == "pass_at_k"
            else ", as its registration declares"
        )
        raise UserError(
            f"{setting} scales a group's rewards by one constant, which algorithm={algorithm} cancels (its "
            f"advantages do not keep a group's scale{why}): use algorithm={', '.join(keeping_group_scale())} with it"
        )


def keeping_group_scale() -> list[str]:
    """The registered estimators that keep a group's scale (TRL's own aside: it depends on scale_rewards)."""
    return [name for name, e in ESTIMATORS.items() if e.keeps_group_scale and name != TRL_ADVANTAGES]
