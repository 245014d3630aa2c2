"""The config's structured schemas in Hydra's ConfigStore, registered by every command before Hydra composes: the
run's (grpo_exp.schema.Schema, with a section of the rollout for each environment scheme's own settings, as
registered beside its code: rollout.textarena), and each reward component's settings as registered beside its code
(conf/reward/<name>.yaml puts them under reward.components.<name>)."""

import dataclasses
import functools

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from grpo_exp.schema import CustomReward, RolloutSchema, Schema


@functools.cache
def run_schema() -> type:
    """Schema, its rollout section (RolloutSchema) with a section per registered environment scheme that declares
    settings of its own (`@environment_scheme("textarena/", settings=TextArenaSettings)`: rollout.textarena).
    Picklable as this module's RunSchema (a config is, by a launcher that runs the job elsewhere)."""
    from grpo_exp.environments.schemes import scheme_settings

    sections = [
        (key, settings, dataclasses.field(default_factory=settings)) for key, settings in scheme_settings().items()
    ]
    rollout = _named(dataclasses.make_dataclass("RunRolloutSchema", sections, bases=(RolloutSchema,)), RolloutSchema)
    return _named(dataclasses.make_dataclass("RunSchema", [("rollout", rollout, MISSING)], bases=(Schema,)), Schema)


def _named(made: type, base: type) -> type:
    made.__module__, made.__doc__ = __name__, base.__doc__
    return made


def __getattr__(name: str) -> type:
    """RunSchema and RunRolloutSchema, made from the registry when first asked for (pickle finds them here)."""
    if name == "RunSchema":
        return run_schema()
    if name == "RunRolloutSchema":
        return run_schema().__dataclass_fields__["rollout"].type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_schemas() -> None:
    # The components' modules import no model library (torch, transformers, TRL: tests/test_command.py), so that
    # --help, --cfg and a refused key answer without loading them.
    from grpo_exp.rewards.registry import REWARD_COMPONENTS

    store = ConfigStore.instance()
    store.store(name="schema", node=run_schema())
    for name, node in REWARD_COMPONENTS.items():
        store.store(group="reward_component", name=name, node=node)
    store.store(group="reward_component", name="custom", node=CustomReward)  # the user's own (CustomReward)
