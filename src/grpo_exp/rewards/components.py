"""The built-in reward components, each registered beside its code: `@reward_component("name", Settings)` on its
factory, in grpo_exp/rewards/<module>.py, with `Settings` its typed settings (the Hydra structured config of
reward.components.<name>, defaults under conf/reward/<name>.yaml). Every module of grpo_exp.rewards is imported by
builtin_components(), so that a new component is its own module and its YAML, nothing else: what the run must check
of it (`check`), the shared objects it reads (`needs`), the settings by which it scales a group's rewards
(`scales_group`) and the task of its own it brings the trainer (`task`) are declared in its registration.

A factory takes the component's settings that it names as parameters, and any shared object the run built once
that it names (grpo_exp.rewards.registry), and returns a TRL reward function.
"""

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from grpo_exp.registries import add


@dataclass(frozen=True)
class Task:
    """A component's task of its own for the trainer: prompts it mixes into the training batches from the run's
    recent samples (the self-verification task), which the run builds once and held-out evaluation measures too.
    Such prompts are neither generated ahead (generation=vllm_async) nor played as rollout=multiturn conversations:
    the run refuses both with the component."""

    what: str  # the task, as the refusals name it: "the self-verification task"
    # build(settings, **the shared objects it names: verifier, p_yes, seed) -> the task object (grpo_exp.run.build)
    build: Callable[..., object]
    # check(settings, cfg): the task against the trainer and the estimator, once those are checked (UserError)
    check: Callable[[DictConfig, DictConfig], None] | None = None


@dataclass(frozen=True)
class Component:
    name: str
    factory: Callable[..., Callable]
    settings: type  # its structured config (a dataclass: weight and the component's own settings)
    # its score grades an answer (a learned one): logged as <name>/mean, <name>/group_std, <name>/auroc every step, and
    # watched by validations (its held-out mean and AUROC can drift from the truth)
    graded: bool = False
    # what the resolve phase checks of it against the whole run, beside its code: check(settings, cfg, processes)
    # raises a UserError (e.g. the judge's model reachable; a cache that must fit under the completion limit)
    check: Callable[[DictConfig, DictConfig, int], None] | None = None
    # shared objects the run builds once that it reads besides those its factory names (grpo_exp.rewards.registry)
    needs: tuple[str, ...] = ()
    # its boolean settings that, true, multiply each group's rewards by one constant: refused with an advantage that
    # cancels it (grpo_exp.trainer.advantages.check_keeps_group_scale)
    scales_group: tuple[str, ...] = ()
    task: Task | None = None  # the task of its own it brings the trainer, if any


REGISTERED: dict[str, Component] = {}


def reward_component(
    name: str,
    settings: type,
    graded: bool = False,
    check: Callable[[DictConfig, DictConfig, int], None] | None = None,
    needs: tuple[str, ...] = (),
    scales_group: tuple[str, ...] = (),
    task: Task | None = None,
) -> Callable:
    """Decorator: the factory is the built-in reward component `name` (reward=name), typed by `settings`; `graded`,
    `check`, `needs`, `scales_group`, `task`: Component's."""

    def register(factory: Callable[..., Callable]) -> Callable[..., Callable]:
        component = Component(name, factory, settings, graded, check, needs, scales_group, task)
        add(REGISTERED, name, component, "a reward component named")
        return factory

    return register


def builtin_components() -> dict[str, Component]:
    """Every built-in component, by name, in the order of their registration (every grpo_exp.rewards module
    imported first)."""
    import grpo_exp.rewards

    for module in pkgutil.iter_modules(grpo_exp.rewards.__path__):
        importlib.import_module(f"grpo_exp.rewards.{module.name}")
    return REGISTERED


@functools.cache
def graded_components() -> frozenset[str]:
    """The names of the built-in components whose score grades an answer (registered with graded=True)."""
    return frozenset(name for name, component in builtin_components().items() if component.graded)
