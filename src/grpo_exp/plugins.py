"""The user's own code, named in the config by import path (`module:name`, or `module.name`).

Import paths are resolved as Hydra's `_target_` users expect from their project directory: the current working
directory is importable (first on sys.path, as under `python -m`). Every failure (no such module, no such
attribute, not callable, an error the user's code raises when called: call_user) is one UserError naming the config
key and its value, never a traceback.
"""

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from grpo_exp.errors import UserError

EXAMPLE_PATH = "my_project.rewards:brevity"


def ensure_cwd_importable() -> None:
    """Put the current working directory first on sys.path (where `python -m` puts it) unless it is there."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def split_import_path(path: str, key: str) -> tuple[str, str]:
    """`pkg.mod:attr.sub` or `pkg.mod.attr` -> (module, attribute path)."""
    module, sep, attribute = path.partition(":")
    if not sep:
        module, _, attribute = path.rpartition(".")
    parts = [*module.split("."), *attribute.split(".")]
    if not module or not attribute or not all(part.isidentifier() for part in parts):
        raise UserError(f"{key}={path}: not an import path; write module:name, e.g. {key}={EXAMPLE_PATH}")
    return module, attribute


def import_object(path: str, key: str) -> Any:
    """The object at `path` (config key `key`), imported with the current directory importable."""
    where = f"{key}={path}"
    module_name, attribute = split_import_path(path, key)
    ensure_cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or module_name
        if module_name == missing or module_name.startswith(f"{missing}."):
            raise UserError(
                f"{where}: module '{missing}' not found (searched the current directory {os.getcwd()}, PYTHONPATH "
                "and the installed packages)"
            ) from None
        raise UserError(f"{where}: importing '{module_name}' failed: {err}") from None  # a dependency of it
    except Exception as err:  # noqa: BLE001 - the user's module fails on import: its error, in one line
        raise UserError(f"{where}: importing '{module_name}' failed: {type(err).__name__}: {err}") from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UserError(f"{where}: module '{module_name}' has no attribute '{attribute}'") from None
    return found


def import_callable(path: str, key: str, what: str) -> Callable:
    """import_object, refusing what cannot be called (`what`: what the key names, for the message)."""
    found = import_object(path, key)
    if not callable(found):
        shown = repr(found) if len(repr(found)) <= 40 else f"{repr(found)[:37]}..."
        raise UserError(f"{key}={path}: not callable ({type(found).__name__} {shown}); {key} names {what}")
    return found


def signature_of(func: Callable) -> inspect.Signature | None:
    """The signature, or None for a callable without one (some builtins and C extensions): not checked then."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def check_takes(func: Callable, kwargs: dict, where: str, settings_key: str) -> None:
    """`func` can be called with `kwargs` (config key `settings_key`), or one UserError starting with `where`; it names
    the settings' keys, never their values (which may be secrets). Not checked without a signature."""
    signature = signature_of(func)
    if signature is None:
        return
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise UserError(
            f"{where}: does not take the keys of {settings_key} {sorted(kwargs)}: {err}; its signature is {signature}"
        ) from None


def call_user(func: Callable, where: str, *args, given: str = "", **kwargs) -> Any:
    """The user's `func` called; what it raises, one UserError (user_error), not a traceback."""
    try:
        return func(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the user's code: whatever it raises is theirs to see, in one line
        raise user_error(where, err, given) from None


def user_error(where: str, err: Exception, given: str = "") -> UserError:
    """What the user's code raised, as one message starting with `where` (the key and its import path): the error's
    type and first line. `given` says what it was called with, by the settings' keys, never their values (which may be
    secrets)."""
    message = f": {str(err).splitlines()[0]}" if str(err).strip() else ""
    called = f" (called with {given})" if given else ""
    return UserError(f"{where} raised {type(err).__name__}{message}{called}")
