"""Errors that are the user's to fix."""

from collections.abc import Callable

from hydra.errors import CompactHydraException, HydraException


class UserError(CompactHydraException):
    """A mistake in the config or the inputs (bad value, missing file, unreachable hub id).

    Hydra prints a CompactHydraException as its message alone, without a stack trace, in single runs and
    in multirun sweeps alike (where the other jobs still run).
    """


class DamagedFile(UserError, ValueError):
    """A file a user or a run directory provides that cannot be read as what it should be: its message names the file
    and what is wrong. A ValueError too, for the readers that skip a damaged file and go on (compare, diagnose)."""


def run_command(main: Callable[[], object]) -> None:
    """A command's `__main__`: runs `main`; a UserError or Hydra error (a bad override or input) exits with
    "Error: <its message>", not a traceback; an int that `main` returns is the exit code (others: 0)."""
    try:
        result = main()
    except (UserError, HydraException) as err:
        from grpo_exp.deprecated import with_old_names

        raise SystemExit(f"Error: {with_old_names(str(err))}") from None
    raise SystemExit(result if isinstance(result, int) and not isinstance(result, bool) else 0)
