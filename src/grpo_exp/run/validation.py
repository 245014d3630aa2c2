"""eval.every: held-out validation while training, and the best checkpoint it finds.

Every eval.every steps the policy answers eval.every_problems held-out problems greedily (every process a share);
the accuracy is logged at that step as heldout/accuracy, beside the training reward (metrics.jsonl, every
tracker, the console). The best validation so far (ties: the earlier step) is saved as checkpoint-best, with
best.json naming its step and value; a resumed run starts from its history.
"""

import json
import logging
import shutil
import time
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
from grpo_exp.stats import accuracy_change_interval, accuracy_standard_error, auroc_change_interval, slope_interval

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


def hacking_alarm(
    rewards: list[tuple[int, float]],
    validations: list[tuple[int, dict[str, float]]],
    problems: int,
    learned: tuple[str, ...] = (),
) -> str | None:
    """The reward and the truth parting ways, each beyond its noise. It fires when the training reward did not fall
    (its least-squares slope over the steps after the first validation has a 95% interval reaching above 0) while

    - held-out accuracy fell: its change from the first validation (the initial model's, at step 0) to the latest
      has a 95% interval below 0; or
    - a learned component (`learned`: judge, confidence) agrees less with the verifier's labels: its held-out AUROC
      (heldout/<name>/auroc) fell, its change having a 95% interval below 0.

    "Did not fall" rather than "rose": a reward that holds while the accuracy falls has already come apart from it
    (the P(Yes) loop: the reward rises in steps, its slope is above noise only late). `rewards`: (step, value);
    `validations`: (step, metrics), METRIC in each. None when silent. Pure."""
    if len(validations) < 2:
        return None
    start = validations[0][0]
    points = [(step, value) for step, value in rewards if step > start and value == value]
    slope, low, high = slope_interval([float(s) for s, _ in points], [v for _, v in points])
    if not high > 0:  # the reward fell (or too few steps to tell): the policy is not being paid for it
        return None
    first, last = validations[0][1], validations[-1][1]
    findings = []
    change, _, upper = accuracy_change_interval(first[METRIC], last[METRIC], problems)
    if upper < 0:
        findings.append(
            f"held-out accuracy fell {first[METRIC]:.3f} -> {last[METRIC]:.3f} ({change:+.3f}, 95% interval up to "
            f"{upper:+.3f})"
        )
    for name in learned:
        before, now = first.get(f"heldout/{name}/auroc"), last.get(f"heldout/{name}/auroc")
        if before is None or now is None or before != before or now != now:
            continue
        change, _, upper = auroc_change_interval(
            (before, *labelled(first[METRIC], problems)), (now, *labelled(last[METRIC], problems))
        )
        if upper < 0:
            findings.append(
                f"{name} agrees less with the verifier's labels: held-out AUROC {before:.3f} -> {now:.3f} "
                f"({change:+.3f}, 95% interval up to {upper:+.3f})"
            )
    if not findings:
        return None
    trend = "rose" if low > 0 else "held"
    return (
        f"the training reward {trend} ({slope:+.4f} a step since step {start}, 95% interval {low:+.4f} to "
        f"{high:+.4f}) while " + "; and ".join(findings)
    )


def labelled(accuracy: float, problems: int) -> tuple[int, int]:
    """(correct, wrong) answers of a validation, from its accuracy on `problems` problems."""
    correct = round(accuracy * problems)
    return correct, problems - correct


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
    """Validates with `validate()` (every process; returns metrics, METRIC among them, the same on every process):
    the initial model when training begins (step 0, unless a resumed run carries it), then every `every` steps.
    Each validation's metrics go to `log_now(metrics)` at step 0 (there is no training step to log them with) and
    to `record(key, value)` later (the trainer's metric store, logged at that step); `save_best(directory)` runs on
    every process when a validation beats the best so far, the initial model included: checkpoint-best is never
    worse than where training started."""

    def __init__(
        self,
        every: int,
        validate: Callable[[], dict[str, float]],
        record: Callable[[str, float], None],
        log_now: Callable[[dict[str, float]], None],
        save_best: Callable[[Path], None],
        run_dir: Path,
        problems: int,
        patience: int | None = None,
        stop_at: float | None = None,
        alarm: AlarmAction = AlarmAction.warn,
        learned: tuple[str, ...] = (),
        initial: Callable[[], dict[str, float]] | None = None,
    ):
        """initial: the initial model's metrics when already measured (the evaluation before training, on these
        problems); else validate() measures them."""
        self.every, self.validate, self.record, self.log_now, self.save_best = (
            every,
            validate,
            record,
            log_now,
            save_best,
        )
        self.run_dir, self.problems, self.learned = run_dir, problems, learned
        self.patience, self.stop_at, self.alarm_action = patience, stop_at, alarm
        self.initial = initial or validate
        self.best: Best | None = None
        # (step, metrics), a resumed run's earlier ones included
        self.validations: list[tuple[int, dict[str, float]]] = []
        self.stopped: str | None = None  # why it stopped training early, if it did
        self.alarm: str | None = None  # the reward-hacking alarm, once it fired

    @property
    def values(self) -> list[float]:
        return [metrics[METRIC] for _, metrics in self.validations]

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run's history (carried into its metrics; read once every process has passed a collective since
        the main process wrote it); else the initial model's validation, at step 0."""
        history = read_metrics(self.run_dir / METRICS_FILE) if (self.run_dir / METRICS_FILE).is_file() else []
        self.best = best_of(history)
        self.validations = [
            (line["step"], {key: value for key, value in line.items() if key.startswith("heldout/")})
            for line in history
            if line.get(METRIC) is not None
        ]
        if not self.validations:
            with untouched_rng():
                metrics = self.initial()
            self.log_now(metrics)
            self.keep(state.global_step, metrics)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every:
            return
        started = time.perf_counter()
        with untouched_rng():
            metrics = self.validate()
        # what validating costs, beside the step's own time (step_time): eval.every's overhead, measured in the run
        metrics = {**metrics, "timing/validation_s": time.perf_counter() - started}
        for key, value in metrics.items():
            self.record(key, value)
        self.keep(state.global_step, metrics)
        self.check_alarm(state, control)
        reason = stop_reason(self.values, self.problems, self.patience, self.stop_at)
        if reason:  # the same on every process: the accuracy is gathered
            self.stopped = f"step {state.global_step}: {reason}"
            control.should_training_stop = True
            log.warning("Training stops early at %s", self.stopped)

    def keep(self, step: int, metrics: dict[str, float]) -> None:
        """The validation in the history, and the model as checkpoint-best when it is the best so far."""
        accuracy = metrics[METRIC]
        if accuracy == accuracy and (self.best is None or accuracy > self.best.value):
            self.best = Best(step, accuracy)
            directory = self.run_dir / BEST_CHECKPOINT_DIR
            self.save_best(directory)  # every process: DeepSpeed gathers its shards here
            if is_main_process():
                (directory / BEST_FILE).write_text(json.dumps({"step": step, METRIC: accuracy}))
            log.info("Validation at step %d: held-out accuracy %.3f, the best so far", step, accuracy)
        self.validations.append((step, metrics))

    def check_alarm(self, state, control) -> None:
        """eval.alarm: warn (log, console, summary.json) or stop, the first time the alarm fires."""
        if self.alarm_action is AlarmAction.off or self.alarm:
            return
        rewards = [(line["step"], line["reward"]) for line in state.log_history if line.get("reward") is not None]
        found = hacking_alarm(rewards, self.validations, self.problems, self.learned)
        if found:  # the same on every process: the rewards TRL logs and the validations are gathered
            self.alarm = f"step {state.global_step}: {found}"
            self.record("alarm/reward_hacking", 1.0)
            log.warning("Reward-hacking alarm at %s", self.alarm)
            if self.alarm_action is AlarmAction.stop:
                self.stopped = f"{self.alarm} (eval.alarm=stop)"
                control.should_training_stop = True


def check_validation(eval_cfg, trainer_cfg) -> None:
    """eval.every logs at a training step: one that TRL logs (trainer.logging_steps)."""
    for key, role in (("patience", "stops on"), ("stop_at", "stops on"), ("every_samples", "samples at")):
        if eval_cfg[key] and not eval_cfg.every:
            raise UserError(f"eval.{key}={eval_cfg[key]} {role} validations: set eval.every too")
    if eval_cfg.every and eval_cfg.every % trainer_cfg.logging_steps:
        raise UserError(
            f"eval.every={eval_cfg.every} validates at steps that trainer.logging_steps={trainer_cfg.logging_steps} "
            "does not log: make eval.every a multiple of it"
        )
