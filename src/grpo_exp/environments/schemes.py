"""Environments by scheme: rollout.environment=<scheme><rest> (e.g. `textarena/GuessTheNumber-v0`,
`openenv/http://127.0.0.1:8000`) is made by the builder registered for that scheme, beside the environment's own
code (`@environment_scheme("textarena/")` in grpo_exp.environments.textarena). Any other value is the user's own
environment class by import path, module:Class (grpo_exp.rollout.environment).

A builder is f(rest, **settings) -> a factory (called once per episode, with no arguments) whose __name__ names the
environment in the metrics. `settings`: the scheme's own settings, a dataclass it declares when it registers
(`settings=TextArenaSettings`), which the run's schema holds under rollout.<scheme> (the prefix without its "/":
rollout.textarena.invalid_move_credit; grpo_exp.run.config_store), passed to the builder by name; no other builder
sees them.
"""

import dataclasses
from collections.abc import Callable, Mapping

from grpo_exp.registries import add

SCHEMES: dict[str, Callable[..., Callable]] = {}
SETTINGS: dict[str, type | None] = {}  # scheme -> its own settings' dataclass (rollout.<key>), None: none


def settings_key(prefix: str) -> str:
    """The section of the rollout config that holds a scheme's own settings: `textarena/` -> rollout.textarena."""
    return prefix.rstrip("/")


def environment_scheme(prefix: str, settings: type | None = None) -> Callable:
    """Decorator: the function builds the environments named `prefix<rest>` (rollout.environment=prefix<rest>),
    taking the fields of `settings` (a dataclass: the scheme's own settings, rollout.<prefix without "/">.*) as
    keyword arguments."""
    if settings is not None and not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise TypeError(f"environment scheme {prefix!r}: its settings are a dataclass, not {settings!r}")
    if settings is not None and not settings_key(prefix).isidentifier():
        raise ValueError(f"environment scheme {prefix!r}: a scheme with settings is a name, e.g. 'mygame/'")

    def register(builder: Callable[..., Callable]) -> Callable[..., Callable]:
        add(SCHEMES, prefix, builder, "an environment scheme")
        SETTINGS[prefix] = settings
        return builder

    return register


def scheme_settings() -> dict[str, type]:
    """Each registered scheme's own settings by their section under rollout (`textarena`: TextArenaSettings), for
    the schemes that declare some, in the order of their registration."""
    builtin_schemes()
    return {settings_key(prefix): settings for prefix, settings in SETTINGS.items() if settings is not None}


def build_scheme(scheme: str, rest: str, rollout_settings: Mapping | None) -> Callable:
    """The factory the scheme's builder makes of `rest`, given its own settings, read from `rollout_settings` (the
    rollout config) under rollout.<scheme>; where absent, the builder keeps its defaults."""
    builder, settings = builtin_schemes()[scheme], SETTINGS[scheme]
    given = (rollout_settings or {}).get(settings_key(scheme)) if settings is not None else None
    names = [field.name for field in dataclasses.fields(settings)] if given is not None else []
    return builder(rest, **{name: given[name] for name in names if name in given})


def builtin_schemes() -> dict[str, Callable[..., Callable]]:
    """Every registered scheme, every module of grpo_exp.environments imported first (so that a new built-in is its
    own module; a module imports its optional package only when its builder runs)."""
    import importlib
    import pkgutil

    import grpo_exp.environments

    for module in pkgutil.iter_modules(grpo_exp.environments.__path__):
        importlib.import_module(f"grpo_exp.environments.{module.name}")
    return SCHEMES


def scheme_of(path: str) -> str | None:
    """The registered scheme `path` starts with, or None (the user's own, by import path)."""
    return next((prefix for prefix in builtin_schemes() if path.startswith(prefix)), None)
