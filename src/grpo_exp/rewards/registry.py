"""Reward components: name -> factory. A `reward=` choice is a `+`-joined mix of these names.

Each factory takes the component's settings from conf/reward/<name>.yaml (all but `weight`), and any shared
object the run built once that it names as a parameter (`p_yes`: the P(Yes) scorer), and returns a TRL reward
function named after the component, so TRL logs it as `rewards/<name>/mean`.
"""

import inspect
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.rewards.confidence import make_confidence_reward
from grpo_exp.rewards.format import make_format_reward
from grpo_exp.rewards.judge import make_judge_reward
from grpo_exp.rewards.length import make_length_reward
from grpo_exp.rewards.math import make_math_reward
from grpo_exp.rewards.repetition import make_repetition_reward
from grpo_exp.rewards.selfverify import make_selfverify_reward

COMPONENTS: dict[str, Callable[..., Callable]] = {
    "math": make_math_reward,
    "format": make_format_reward,
    "length": make_length_reward,
    "repetition": make_repetition_reward,
    "judge": make_judge_reward,
    "confidence": make_confidence_reward,
    "selfverify": make_selfverify_reward,
}


def build_rewards(reward_cfg: DictConfig, shared: dict | None = None) -> tuple[list[Callable], list[float]]:
    """The reward functions and their weights, in the order of the mix. Cheap: call it before loading models.

    shared: objects built once by the run, handed to the factories that take them by name (e.g. `p_yes`)."""
    if not reward_cfg.components:
        raise UserError(f"reward: no components; choose a '+'-joined mix of {sorted(COMPONENTS)}")
    for name, settings in reward_cfg.components.items():
        if name not in COMPONENTS:
            raise UserError(f"reward component '{name}' is unknown; known components: {sorted(COMPONENTS)}")
        if "weight" not in settings:
            raise UserError(f"reward.components.{name}.weight is missing")
    names = list(reward_cfg.components)
    functions = [build_component(name, reward_cfg.components[name], shared or {}) for name in names]
    weights = [float(reward_cfg.components[name].weight) for name in names]
    return functions, weights


def build_component(name: str, settings: DictConfig, shared: dict) -> Callable:
    container = OmegaConf.to_container(settings, resolve=True, enum_to_str=True)
    kwargs = {k: v for k, v in container.items() if k != "weight"}
    factory = COMPONENTS[name]
    kwargs |= {k: v for k, v in shared.items() if k in inspect.signature(factory).parameters}
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as err:
        allowed = ["weight", *inspect.signature(factory).parameters]
        raise UserError(f"reward.components.{name}: {err}; its settings are {allowed}") from err
