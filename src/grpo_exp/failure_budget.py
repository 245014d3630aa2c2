"""A budget of failures over the last steps (the judge's unscored answers, the environments' failed episodes): every
process's counts together, so that every process stops at the same step."""

from collections import deque
from collections.abc import Callable

from grpo_exp.data_parallel import sum_over_processes
from grpo_exp.errors import UserError


class FailureBudget:
    """Past `max_rate` failures of the attempts of the last `window` steps, spend() raises UserError(describe(failed,
    attempts, steps))."""

    def __init__(self, max_rate: float, window: int, describe: Callable[[float, float, int], str]):
        self.max_rate, self.describe = max_rate, describe
        self.steps: deque[tuple[float, float]] = deque(maxlen=window)

    def spend(self, failures: float, attempts: float) -> None:
        """This step's failures of its attempts, on this process (a collective: every process calls it)."""
        failures, attempts = sum_over_processes([failures, attempts])
        self.steps.append((failures, attempts))
        failed, total = (sum(column) for column in zip(*self.steps, strict=True))
        if total and failed / total > self.max_rate:
            raise UserError(self.describe(failed, total, len(self.steps)))
