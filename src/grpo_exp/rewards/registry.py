"""Reward components: name -> factory. A `reward=` choice is a `+`-joined mix of these names.

Each factory takes the component's settings (typed by its settings' dataclass beside it, weights set in
conf/reward/<name>.yaml) that it names as parameters, and any shared
object the run built once that it names as a parameter (`p_yes`: the P(Yes) scorer; `verifier`: the run's
correctness labels; `judge`; `max_completion_length`), and returns a TRL reward
function named after the component, so TRL logs it as `rewards/<name>/mean`.

Any other name is the user's own component (schema.CustomReward: a function or a factory by import path,
grpo_exp.rewards.custom), e.g. reward/mine.yaml in the user's config directory, mixed as reward=math+mine.
"""

import dataclasses
import inspect
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from grpo_exp.errors import UserError
from grpo_exp.rewards.components import Task, builtin_components
from grpo_exp.rewards.custom import build_custom, check_custom, is_custom
from grpo_exp.schema import CustomReward, check_values

# name -> factory, each registered beside its code (grpo_exp.rewards.components: `@reward_component(name, Settings)`)
COMPONENTS: dict[str, Callable[..., Callable]] = {name: c.factory for name, c in builtin_components().items()}
REWARD_COMPONENTS: dict[str, type] = {name: c.settings for name, c in builtin_components().items()}


def typed_components(reward_cfg: DictConfig) -> dict[str, DictConfig]:
    """Each component of the mix, in order, on its typed schema with every value checked (the resolve phase); the
    user's own components' import paths and signatures too."""
    if not reward_cfg.components:
        raise UserError(f"reward: no components; choose a '+'-joined mix of {sorted(COMPONENTS)}")
    for name, settings in reward_cfg.components.items():
        custom = isinstance(settings, DictConfig) and is_custom(settings)
        if name in COMPONENTS and custom:
            raise UserError(
                f"reward.components.{name}: '{name}' is a built-in component; give your own another name "
                f"(built-in: {sorted(COMPONENTS)})"
            )
        if name not in COMPONENTS and not custom:
            raise UserError(
                f"reward component '{name}' is unknown; known components: {sorted(COMPONENTS)}, or one of your own: "
                f"reward.components.{name}.function=module:name (a reward function) or .factory=module:name"
            )
    typed = {name: component_settings(name, settings) for name, settings in reward_cfg.components.items()}
    for name, settings in typed.items():
        if name not in COMPONENTS:
            check_custom(name, settings)
    return typed


def check_components(components: dict[str, DictConfig], cfg: DictConfig, processes: int) -> None:
    """What each built-in component of the mix declares to check against the whole run (Component.check)."""
    for name, settings in components.items():
        component = builtin_components().get(name)
        if component is not None and component.check is not None:
            component.check(settings, cfg, processes)


def shared_needs(components: dict[str, DictConfig]) -> set[str]:
    """The names of the shared objects the mix reads: those its factories name as parameters, and those the
    components declare (Component.needs)."""
    needed = set()
    for name in components:
        component = builtin_components().get(name)
        if component is not None:
            needed |= set(inspect.signature(component.factory).parameters) | set(component.needs)
    return needed


def tasks(components: dict[str, DictConfig]) -> dict[str, Task]:
    """The tasks of their own that components of the mix bring the trainer (Component.task), by component."""
    registered = builtin_components()
    found = {name: registered[name].task for name in components if name in registered}
    return {name: task for name, task in found.items() if task is not None}


def check_tasks(components: dict[str, DictConfig], cfg: DictConfig) -> None:
    """Each task's check against the trainer and the estimator (Task.check)."""
    for name, task in tasks(components).items():
        if task.check is not None:
            task.check(components[name], cfg)


def build_tasks(components: dict[str, DictConfig], shared: dict) -> dict[str, object]:
    """Each component's task, built from its settings and the shared objects its builder names (Task.build)."""
    built = {}
    for name, task in tasks(components).items():
        parameters = inspect.signature(task.build).parameters
        built[name] = task.build(components[name], **{key: value for key, value in shared.items() if key in parameters})
    return built


def group_scalings(components: dict[str, DictConfig]) -> list[str]:
    """The settings of the mix, as `key=true`, that multiply each group's rewards by one constant
    (Component.scales_group), where set."""
    scalings = []
    for name, settings in components.items():
        component = builtin_components().get(name)
        for key in component.scales_group if component is not None else ():
            if settings[key]:
                scalings.append(f"reward.components.{name}.{key}=true")
    return scalings


def reward_weights(components: dict[str, DictConfig]) -> list[float]:
    """The components' weights, in the order of the mix (TRL's reward_weights)."""
    return [float(settings.weight) for settings in components.values()]


def build_rewards(components: dict[str, DictConfig], shared: dict | None = None) -> list[Callable]:
    """The reward functions, in the order of the mix, from typed_components' settings. Cheap: no model loads.

    shared: objects built once by the run, handed to the factories that take them by name (e.g. `p_yes`)."""
    return [build_component(name, settings, shared or {}) for name, settings in components.items()]


def component_settings(name: str, settings: DictConfig) -> DictConfig:
    """A component's settings on its typed schema (defaults filled in), every value checked."""
    schema = REWARD_COMPONENTS.get(name, CustomReward)
    # Resolved where it stands in the whole config first: a setting may point elsewhere (the judge's `${judge}`).
    resolved = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else settings
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), resolved)
    except (ConfigKeyError, ValidationError) as err:  # an unknown setting, or a value of the wrong type
        allowed = [f.name for f in dataclasses.fields(schema)]
        raise UserError(f"reward.components.{name}: {err.msg}; its settings are {allowed}") from None
    if OmegaConf.is_missing(typed, "weight"):
        raise UserError(f"reward.components.{name}.weight is missing")
    check_values(typed, f"reward.components.{name}.")
    return typed


def build_component(name: str, settings: DictConfig, shared: dict) -> Callable:
    """The factory takes the settings it names (the others drive other parts, e.g. the self-verification task)."""
    if name not in COMPONENTS:
        return build_custom(name, settings)
    factory = COMPONENTS[name]
    parameters = inspect.signature(factory).parameters
    kwargs = {key: settings[key] for key in parameters if key in settings}
    kwargs = OmegaConf.to_container(OmegaConf.create(kwargs), resolve=True) if kwargs else {}
    return factory(**kwargs, **{key: value for key, value in shared.items() if key in parameters})
