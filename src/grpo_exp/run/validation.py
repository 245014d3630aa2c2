"""eval.every: held-out validation while training, and the best checkpoint it finds.

Every eval.every steps the policy answers eval.every_problems held-out problems greedily (every process a share);
the accuracy is logged at that step as heldout/accuracy, beside the training reward (metrics.jsonl, every
tracker, the console). The best validation so far (ties: the earlier step) is saved as checkpoint-best, with
best.json naming its step and value; a resumed run starts from its history.
"""

import json
import logging
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

from grpo_exp.errors import UserError
from grpo_exp.run.distributed import is_main_process
from grpo_exp.run.files import METRICS_FILE
from grpo_exp.run.tracking import read_metrics
from grpo_exp.schema import AlarmAction
from grpo_exp.stats import accuracy_change_interval, accuracy_standard_error, slope_interval

log = logging.getLogger(__name__)

BEST_CHECKPOINT_DIR = "checkpoint-best"
BEST_FILE = "best.json"  # in checkpoint-best: the step and the value it was chosen by
METRIC = "heldout/accuracy"


@dataclass(frozen=True)
class Best:
    step: int
    value: float


def best_of(history: list[dict], metric: str = METRIC) -> Best | None:
    """The best logged value of `metric` (ties: the earlier step); None when none was logged. Pure."""
    best = None
    for line in history:
        value = line.get(metric)
        if value is not None and value == value and (best is None or value > best.value):  # NaN never wins
            best = Best(int(line["step"]), float(value))
    return best


def validations_without_improvement(values: list[float], problems: int) -> int:
    """How many validations since the last that beat the best before it by more than that best's noise (one
    standard error): the patience spent. Smaller gains are within noise and do not reset it. Pure."""
    reference, since = None, 0
    for value in values:
        if value == value and (reference is None or value > reference + accuracy_standard_error(reference, problems)):
            reference, since = value, 0
        else:
            since += 1
    return since


def stop_reason(values: list[float], problems: int, patience: int | None, stop_at: float | None) -> str | None:
    """Why training should stop after these validations (eval.patience, eval.stop_at), or None. Pure."""
    if stop_at is not None and values and values[-1] >= stop_at:
        return f"held-out accuracy {values[-1]:.3f} reached eval.stop_at={stop_at}"
    if patience is not None and validations_without_improvement(values, problems) >= patience:
        return (
            f"no held-out improvement beyond one standard error in eval.patience={patience} validations "
            f"(best {max(v for v in values if v == v):.3f})"
        )
    return None


def hacking_alarm(rewards: list[tuple[int, float]], validations: list[tuple[int, float]], problems: int) -> str | None:
    """The reward rising while held-out accuracy falls, each beyond its noise: the training reward's slope over the
    steps since the first validation has a 95% interval above 0, and the accuracy's change from the first
    validation to the latest has one below 0. `rewards`, `validations`: (step, value). None when silent. Pure."""
    if len(validations) < 2:
        return None
    start = validations[0][0]
    points = [(step, value) for step, value in rewards if step >= start and value == value]
    slope, low, _ = slope_interval([float(s) for s, _ in points], [v for _, v in points])
    (_, first), (_, last) = validations[0], validations[-1]
    change, _, high = accuracy_change_interval(first, last, problems)
    if low > 0 and high < 0:
        return (
            f"the training reward rose ({slope:+.4f} a step since step {start}, 95% interval from {low:+.4f}) while "
            f"held-out accuracy fell {first:.3f} -> {last:.3f} ({change:+.3f}, 95% interval up to {high:+.3f})"
        )
    return None


def carry_best(previous_run: Path, run_dir: Path, up_to_step: int) -> None:
    """A resumed run's checkpoint-best: the previous attempt's, when it was chosen at or before the step the run
    resumes from (later steps are trained, and validated, again)."""
    source = previous_run / BEST_CHECKPOINT_DIR
    if not (source / BEST_FILE).is_file() or previous_run.resolve() == run_dir.resolve():
        return
    if json.loads((source / BEST_FILE).read_text())["step"] <= up_to_step:
        shutil.copytree(source, run_dir / BEST_CHECKPOINT_DIR, dirs_exist_ok=True)


@contextmanager
def untouched_rng():
    """Evaluation inside training (which may sample) leaves the random state as it was: training goes on exactly
    as without it."""
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
        yield


class BeforeTraining(TrainerCallback):
    """Calls `evaluate()` when training begins: the model is then where it trains (on its device, wrapped or
    sharded by accelerate), so that every process can evaluate a share of the problems."""

    def __init__(self, evaluate: Callable[[], None]):
        self.evaluate = evaluate

    def on_train_begin(self, args, state, control, **kwargs):
        with untouched_rng():
            self.evaluate()


class PeriodicValidation(TrainerCallback):
    """Calls `validate()` (every process; returns the held-out accuracy) every `every` steps, hands the value to
    `record(key, value)` (the trainer's metric store, logged at this step), and `save_best(directory)` on every
    process when it beats the best so far."""

    def __init__(
        self,
        every: int,
        validate: Callable[[], float],
        record: Callable[[str, float], None],
        save_best: Callable[[Path], None],
        run_dir: Path,
        problems: int,
        patience: int | None = None,
        stop_at: float | None = None,
        alarm: AlarmAction = AlarmAction.warn,
    ):
        self.every, self.validate, self.record, self.save_best = every, validate, record, save_best
        self.run_dir, self.problems = run_dir, problems
        self.patience, self.stop_at, self.alarm_action = patience, stop_at, alarm
        self.best: Best | None = None
        self.validations: list[tuple[int, float]] = []  # (step, accuracy), a resumed run's earlier ones included
        self.stopped: str | None = None  # why it stopped training early, if it did
        self.alarm: str | None = None  # the reward-hacking alarm, once it fired

    @property
    def values(self) -> list[float]:
        return [value for _, value in self.validations]

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run's best so far, from the history carried into its metrics (read once every process has
        passed a collective since the main process wrote it)."""
        history = read_metrics(self.run_dir / METRICS_FILE) if (self.run_dir / METRICS_FILE).is_file() else []
        self.best = best_of(history)
        self.validations = [(line["step"], line[METRIC]) for line in history if line.get(METRIC) is not None]

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every:
            return
        with untouched_rng():
            accuracy = self.validate()
        self.record(METRIC, accuracy)
        if accuracy == accuracy and (self.best is None or accuracy > self.best.value):
            self.best = Best(state.global_step, accuracy)
            directory = self.run_dir / BEST_CHECKPOINT_DIR
            self.save_best(directory)  # every process: DeepSpeed gathers its shards here
            if is_main_process():
                (directory / BEST_FILE).write_text(json.dumps({"step": self.best.step, METRIC: accuracy}))
            log.info("Validation at step %d: held-out accuracy %.3f, the best so far", state.global_step, accuracy)
        self.validations.append((state.global_step, accuracy))
        self.check_alarm(state, control)
        reason = stop_reason(self.values, self.problems, self.patience, self.stop_at)
        if reason:  # the same on every process: the accuracy is gathered
            self.stopped = f"step {state.global_step}: {reason}"
            control.should_training_stop = True
            log.warning("Training stops early at %s", self.stopped)

    def check_alarm(self, state, control) -> None:
        """eval.alarm: warn (log, console, summary.json) or stop, the first time the alarm fires."""
        if self.alarm_action is AlarmAction.off or self.alarm:
            return
        rewards = [(line["step"], line["reward"]) for line in state.log_history if line.get("reward") is not None]
        found = hacking_alarm(rewards, self.validations, self.problems)
        if found:  # the same on every process: the rewards TRL logs and the accuracy are gathered
            self.alarm = f"step {state.global_step}: {found}"
            self.record("alarm/reward_hacking", 1.0)
            log.warning("Reward-hacking alarm at %s", self.alarm)
            if self.alarm_action is AlarmAction.stop:
                self.stopped = f"{self.alarm} (eval.alarm=stop)"
                control.should_training_stop = True


def check_validation(eval_cfg, trainer_cfg) -> None:
    """eval.every logs at a training step: one that TRL logs (trainer.logging_steps)."""
    for key in ("patience", "stop_at"):
        if eval_cfg[key] is not None and not eval_cfg.every:
            raise UserError(f"eval.{key}={eval_cfg[key]} stops on validations: set eval.every too")
    if eval_cfg.every and eval_cfg.every % trainer_cfg.logging_steps:
        raise UserError(
            f"eval.every={eval_cfg.every} validates at steps that trainer.logging_steps={trainer_cfg.logging_steps} "
            "does not log: make eval.every a multiple of it"
        )
