"""The user's own reward components (schema.CustomReward), by import path.

reward/<name>.yaml in the user's config directory (`--config-dir DIR`), or overrides alone:

    defaults:
      - /reward_component/custom@components.mine
      - _self_
    components:
      mine:
        weight: 0.5
        function: my_project.rewards:brevity   # f(prompts, completions, **kwargs) -> list[float | None]
        # or: factory: my_project.rewards:make_brevity, called once as make_brevity(**settings)
        # settings: {max_words: 50}

Checked at resolve time, before any model loads: the import path (module, attribute, callable), a function's
signature (it must take TRL's keyword arguments: **kwargs), a factory's against the settings. The function a
factory returns is checked when the run builds its rewards (still before any model loads). The reward function
TRL calls is a wrapper named after the component (TRL logs rewards/<name>/mean) that checks each call's result:
one number (or None: not scored) per completion.
"""

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.plugins import call_user, check_takes, import_callable, signature_of, user_error
from grpo_exp.schema import CustomReward

CONVENTION = (
    "a reward function takes TRL's keyword arguments: f(prompts, completions, **kwargs) -> one float (or None) per "
    "completion, kwargs being completion_ids, trainer_state and the dataset's columns (question, solution, ...)"
)


def is_custom(settings: DictConfig) -> bool:
    """Settings of the user's own component: on its schema (reward/<name>.yaml), or naming a function or factory."""
    if OmegaConf.get_type(settings) is CustomReward:
        return True
    return any(settings.get(key) is not None for key in ("function", "factory"))


def check_custom(name: str, settings: DictConfig) -> None:
    """The resolve phase: the import path and the signature, or one UserError naming the key."""
    key = f"reward.components.{name}"
    function, factory = settings.function, settings.factory
    if function is None and factory is None:
        raise UserError(f"{key}: set {key}.function (a reward function) or {key}.factory, as module:name")
    if function is not None and factory is not None:
        raise UserError(f"{key}: set one of {key}.function and {key}.factory, not both")
    if function is not None:
        if settings.settings:
            raise UserError(
                f"{key}.settings: settings are the keyword arguments of a factory ({key}.factory=module:name); "
                f"{key}.function takes none"
            )
        func = import_callable(function, f"{key}.function", "a reward function")
        check_reward_function(func, f"{key}.function={function}")
        return
    made = import_callable(factory, f"{key}.factory", "a factory returning a reward function")
    kwargs = OmegaConf.to_container(settings.settings, resolve=True)
    check_takes(made, kwargs, f"{key}.factory={factory}", f"{key}.settings")


def check_reward_function(func: Callable, where: str) -> None:
    signature = signature_of(func)
    if signature is None:
        return
    parameters = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise UserError(f"{where}: must accept **kwargs: {CONVENTION}; its signature is {signature}")
    by_position = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty]
    if by_position:
        raise UserError(f"{where}: TRL passes every argument by name, so {by_position} cannot be positional-only")


def build_custom(name: str, settings: DictConfig) -> Callable:
    """The user's reward function (a factory's, called with the settings), named after the component."""
    key = f"reward.components.{name}"
    if settings.function is not None:
        label = settings.function
        func = import_callable(label, f"{key}.function", "a reward function")
    else:
        label = settings.factory
        factory = import_callable(label, f"{key}.factory", "a factory returning a reward function")
        kwargs = OmegaConf.to_container(settings.settings, resolve=True)
        given = f"the keys of {key}.settings {sorted(kwargs)}" if kwargs else "no settings"
        func = call_user(factory, f"{key}.factory={label}", given=given, **kwargs)
        if not callable(func):
            raise UserError(f"{key}.factory={label} returned a {type(func).__name__}, not a function: {CONVENTION}")
        check_reward_function(func, f"{key}.factory={label}: the function it returned")
    return named_reward(name, label, func)


def named_reward(name: str, label: str, func: Callable) -> Callable:
    """`func` called as TRL calls it, its result checked, under the component's name (TRL's rewards/<name>/mean)."""
    call = type(func).__call__ if not inspect.isroutine(func) else None  # a callable object's method
    where = f"reward component '{name}' ({label})"  # what it raises while training: one message naming it
    if inspect.iscoroutinefunction(func) or (call is not None and inspect.iscoroutinefunction(call)):

        async def reward(completions, **kwargs):
            try:
                rewards = await func(completions=completions, **kwargs)
            except Exception as err:  # noqa: BLE001 - the user's code: its error in one line, naming the component
                raise user_error(where, err) from err
            return checked_rewards(name, label, rewards, len(completions))

    else:

        def reward(completions, **kwargs):
            try:
                rewards = func(completions=completions, **kwargs)
            except Exception as err:  # noqa: BLE001 - as above
                raise user_error(where, err) from err
            return checked_rewards(name, label, rewards, len(completions))

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = f"The user's reward component '{name}': {label}."
    return functools.update_wrapper(reward, func, assigned=("__module__",), updated=())


def checked_rewards(name: str, label: str, rewards, expected: int) -> list[float | None]:
    """One float (or None) per completion, or a UserError naming the component."""
    where = f"reward component '{name}' ({label})"
    is_array = getattr(rewards, "ndim", None) == 1  # a NumPy array or torch tensor of rewards
    if isinstance(rewards, str | bytes) or not (isinstance(rewards, Sequence) or is_array):
        raise UserError(f"{where} returned a {type(rewards).__name__}: {CONVENTION}")
    values = list(rewards)
    if len(values) != expected:
        raise UserError(f"{where} returned {len(values)} rewards for {expected} completions: {CONVENTION}")
    out: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        number = value.item() if getattr(value, "ndim", None) == 0 else value  # a NumPy or torch scalar
        if isinstance(number, numbers.Real) and not isinstance(number, str):
            if not math.isfinite(number):  # one inf would become a huge advantage and wreck the weights
                raise UserError(
                    f"{where} returned {number} for completion {i}: rewards are finite numbers, or None for a "
                    "completion it does not score"
                )
            out.append(float(number))
            continue
        raise UserError(
            f"{where} returned {value!r} ({type(value).__name__}) for completion {i}: rewards are numbers, or None "
            "for a completion it does not score"
        )
    return out
