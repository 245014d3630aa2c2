"""Errors that are the user's to fix."""

from hydra.errors import CompactHydraException


class UserError(CompactHydraException):
    """A mistake in the config or the inputs (bad value, missing file, unreachable hub id).

    Hydra prints a CompactHydraException as its message alone, without a stack trace, in single runs and
    in multirun sweeps alike (where the other jobs still run).
    """
