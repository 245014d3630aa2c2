"""Environments by scheme: rollout.environment=<scheme><rest> (e.g. `textarena/GuessTheNumber-v0`,
`openenv/http://127.0.0.1:8000`) is made by the builder registered for that scheme, beside the environment's own
code (`@environment_scheme("textarena/")` in grpo_exp.environments.textarena). Any other value is the user's own
environment class by import path, module:Class (grpo_exp.rollout.environment).

A builder is f(rest, **settings) -> a factory (called once per episode, with no arguments) whose __name__ names the
environment in the metrics. `settings`: the rollout settings the scheme declares as its own when it registers
(`settings=("invalid_move_credit",)`: rollout.invalid_move_credit, TextArena's), passed by name; no other builder sees
them.
"""

from collections.abc import Callable, Mapping

SCHEMES: dict[str, Callable[..., Callable]] = {}
SETTINGS: dict[str, tuple[str, ...]] = {}  # scheme -> the names of its own rollout settings


def environment_scheme(prefix: str, settings: tuple[str, ...] = ()) -> Callable:
    """Decorator: the function builds the environments named `prefix<rest>` (rollout.environment=prefix<rest>),
    taking the rollout settings named in `settings` as keyword arguments."""

    def register(builder: Callable[..., Callable]) -> Callable[..., Callable]:
        if prefix in SCHEMES:
            raise ValueError(f"an environment scheme {prefix!r} is already registered")
        SCHEMES[prefix] = builder
        SETTINGS[prefix] = tuple(settings)
        return builder

    return register


def build_scheme(scheme: str, rest: str, rollout_settings: Mapping | None) -> Callable:
    """The factory the scheme's builder makes of `rest`, given the rollout settings it declared (those absent from
    `rollout_settings` keep the builder's defaults)."""
    given = rollout_settings or {}
    own = {name: given[name] for name in SETTINGS[scheme] if name in given}
    return builtin_schemes()[scheme](rest, **own)


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
