"""The built-in registries' one mechanism: a dict filled by a decorator beside each entry's code, in the order the
entries' modules register them, and a second entry of one name refused at import (a mistake in the code, not the
user's)."""

from collections.abc import Callable
from typing import Any


def add(registry: dict, key: Any, entry: Any, what: str) -> None:
    """`entry` into `registry` under `key`; `what` names the kind in the refusal ("an answer rule named")."""
    if key in registry:
        raise ValueError(f"{what} {key!r} is already registered")
    registry[key] = entry


def by_name(registry: dict, what: str) -> Callable[[str], Callable]:
    """The decorator of a registry whose entries are the decorated functions themselves: `@decorator(name)`."""

    def decorator(name: str) -> Callable:
        def register(entry: Callable) -> Callable:
            add(registry, name, entry, what)
            return entry

        return register

    return decorator
