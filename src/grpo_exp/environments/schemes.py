"""Environments by scheme: rollout.environment=<scheme><rest> (e.g. `textarena/GuessTheNumber-v0`,
`openenv/http://127.0.0.1:8000`) is made by the builder registered for that scheme, beside the environment's own
code (`@environment_scheme("textarena/")` in grpo_exp.environments.textarena). Any other value is the user's own
environment class by import path, module:Class (grpo_exp.rollout.environment).

A builder is f(rest, invalid_move_credit) -> a factory (called once per episode, with no arguments) whose
__name__ names the environment in the metrics.
"""

from collections.abc import Callable

SCHEMES: dict[str, Callable[..., Callable]] = {}


def environment_scheme(prefix: str) -> Callable:
    """Decorator: the function builds the environments named `prefix<rest>` (rollout.environment=prefix<rest>)."""

    def register(builder: Callable[..., Callable]) -> Callable[..., Callable]:
        if prefix in SCHEMES:
            raise ValueError(f"an environment scheme {prefix!r} is already registered")
        SCHEMES[prefix] = builder
        return builder

    return register


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
