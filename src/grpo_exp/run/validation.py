"""eval.every: held-out validation while training, and the best checkpoint it finds.

Every eval.every steps the policy answers eval.every_problems held-out problems greedily (every process a share);
the accuracy is logged at that step as heldout/accuracy, beside the training reward (metrics.jsonl, every
tracker, the console). The best validation so far by eval.best_metric (ties: the earlier step) is saved as
checkpoint-best, the next eval.keep_top_k - 1 as checkpoint-top/step-<N>, each with best.json naming its step and
value; a resumed run starts from its history and the models it kept.
"""

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

from grpo_exp.errors import UserError
from grpo_exp.run.distributed import is_main_process, wait_for_everyone
from grpo_exp.run.files import METRICS_FILE
from grpo_exp.run.tracking import read_metrics
from grpo_exp.schema import AlarmAction
from grpo_exp.stats import (
    accuracy_change_interval,
    accuracy_standard_error,
    auroc_change_interval,
    auroc_standard_error,
    slope_interval,
)

log = logging.getLogger(__name__)

BEST_CHECKPOINT_DIR = "checkpoint-best"
TOP_CHECKPOINTS_DIR = "checkpoint-top"  # eval.keep_top_k > 1: the runners-up, as step-<N>
BEST_FILE = "best.json"  # in each kept checkpoint: its step, and the metric it was chosen by with its value
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


def ranked(kept: list[Best], candidate: Best, k: int) -> list[Best]:
    """The best k of the kept validations and a candidate, best first (ties: the earlier step). Pure."""
    return sorted([*kept, candidate], key=lambda best: (-best.value, best.step))[:k]


def validation_metric_names(samples: int, learned: tuple[str, ...]) -> list[str]:
    """What a validation logs: held-out accuracy; pass@1..k and maj@k with eval.every_samples=k; each learned
    component's held-out mean and AUROC. Pure."""
    names = [METRIC]
    if samples:
        names += [f"heldout/pass@{k}" for k in range(1, samples + 1)] + [f"heldout/maj@{samples}"]
    return names + [f"heldout/{name}/{stat}" for name in learned for stat in ("mean", "auroc")]


def metric_standard_error(metric: str, metrics: dict[str, float], problems: int) -> float:
    """The noise of one validation's `metric`, measured on `problems` problems. Pure.

    - accuracy, pass@k, maj@k: a proportion of the problems, binomial (accuracy_standard_error);
    - a learned component's AUROC: Hanley & McNeil's, from that validation's correct and wrong answers;
    - a learned component's mean: its scores lie in [0, 1], and no such score has a larger variance for its mean than
      a 0/1 one, so the binomial standard error bounds it (a conservative noise).
    """
    value = metrics[metric]
    if metric.endswith("/auroc"):
        return auroc_standard_error(value, *labelled(metrics[METRIC], problems))
    return accuracy_standard_error(min(max(value, 0.0), 1.0), problems)


def validations_without_improvement(values: list[float], errors: list[float]) -> int:
    """How many validations since the last that beat the best before it by more than that best's noise (its
    standard error, `errors[i]` for `values[i]`): the patience spent. Smaller gains are within noise and do not
    reset it; a NaN (nothing measured, e.g. an AUROC without both right and wrong answers) neither. Pure."""
    reference, since = None, 0
    for value, error in zip(values, errors, strict=True):
        if value != value:
            continue
        if reference is None or value > reference[0] + reference[1]:
            reference, since = (value, error if error == error else 0.0), 0
        else:
            since += 1
    return since


def stop_reason(
    values: list[float], errors: list[float], patience: int | None, stop_at: float | None, metric: str = METRIC
) -> str | None:
    """Why training should stop after these validations of `metric` (eval.patience, eval.stop_at), or None. Pure."""
    if stop_at is not None and values and values[-1] >= stop_at:
        return f"{metric} {values[-1]:.3f} reached eval.stop_at={stop_at}"
    measured = [value for value in values if value == value]
    if patience is not None and measured and validations_without_improvement(values, errors) >= patience:
        return (
            f"no held-out improvement of {metric} beyond one standard error in eval.patience={patience} validations "
            f"(best {max(measured):.3f})"
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
    """A resumed run's kept checkpoints: the previous attempt's that were chosen at or before the step the run
    resumes from (later steps are trained, and validated, again)."""
    if previous_run.resolve() == run_dir.resolve():
        return
    for source in kept_checkpoints(previous_run):
        if json.loads((source / BEST_FILE).read_text())["step"] <= up_to_step:
            shutil.copytree(source, run_dir / source.relative_to(previous_run), dirs_exist_ok=True)


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """The validated checkpoints a run keeps: checkpoint-best, then checkpoint-top/step-<N>."""
    candidates = [run_dir / BEST_CHECKPOINT_DIR, *sorted((run_dir / TOP_CHECKPOINTS_DIR).glob("step-*"))]
    return [path for path in candidates if (path / BEST_FILE).is_file()]


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
    to `record(key, value)` later (the trainer's metric store, logged at that step).

    The `keep_top_k` best validations by `metric` keep their model: `save_best(directory)` runs on every process
    when a validation enters them, the initial model included, so checkpoint-best is never worse than where
    training started. The best is checkpoint-best; the others are checkpoint-top/step-<N>."""

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
        metric: str = METRIC,
        keep_top_k: int = 1,
    ):
        """initial: the initial model's metrics when already measured (the evaluation before training, on these
        problems); else validate() measures them. metric: what checkpoint-best, keep_top_k and early stopping go
        by (eval.best_metric; higher is better)."""
        self.every, self.validate, self.record, self.log_now, self.save_best = (
            every,
            validate,
            record,
            log_now,
            save_best,
        )
        self.run_dir, self.problems, self.learned = run_dir, problems, learned
        self.patience, self.stop_at, self.alarm_action = patience, stop_at, alarm
        self.metric, self.keep_top_k = metric, keep_top_k
        self.initial = initial or validate
        self.kept: list[Best] = []  # the validations whose model is kept, best first
        # (step, metrics), a resumed run's earlier ones included
        self.validations: list[tuple[int, dict[str, float]]] = []
        self.stopped: str | None = None  # why it stopped training early, if it did
        self.alarm: str | None = None  # the reward-hacking alarm, once it fired

    @property
    def best(self) -> Best | None:
        return self.kept[0] if self.kept else None

    def metrics_at(self, step: int) -> dict[str, float]:
        return next(metrics for at, metrics in self.validations if at == step)

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run's history (carried into its metrics; read once every process has passed a collective since
        the main process wrote it) and the models it kept; else the initial model's validation, at step 0.

        Only a resumed run (global_step > 0) reads the file: in a fresh run the main process writes it at step 0,
        and a process that read it after that would take itself for a resumed one, keep other checkpoints than the
        main process, and wait in a barrier the others never reach."""
        metrics_file = self.run_dir / METRICS_FILE
        history = read_metrics(metrics_file) if state.global_step > 0 and metrics_file.is_file() else []
        self.validations = [
            (line["step"], {key: value for key, value in line.items() if key.startswith("heldout/")})
            for line in history
            if line.get(METRIC) is not None
        ]
        if self.validations:
            self.resume_kept(state.global_step)
        else:
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
        values = [metrics.get(self.metric, math.nan) for _, metrics in self.validations]
        errors = [self.standard_error(metrics) for _, metrics in self.validations]
        reason = stop_reason(values, errors, self.patience, self.stop_at, self.metric)
        if reason:  # the same on every process: the accuracy is gathered
            self.stopped = f"step {state.global_step}: {reason}"
            control.should_training_stop = True
            log.warning("Training stops early at %s", self.stopped)

    def standard_error(self, metrics: dict[str, float]) -> float:
        if metrics.get(self.metric) is None or metrics[self.metric] != metrics[self.metric]:
            return math.nan
        return metric_standard_error(self.metric, metrics, self.problems)

    def keep(self, step: int, metrics: dict[str, float]) -> None:
        """The validation in the history, and its model kept when it is among the keep_top_k best so far."""
        self.validations.append((step, metrics))
        value = metrics.get(self.metric, math.nan)
        if value != value:  # NaN never enters
            return
        candidate = Best(step, value)
        kept = ranked(self.kept, candidate, self.keep_top_k)
        if candidate not in kept:
            return
        if is_main_process():  # make room: the dropped go, a dethroned best becomes a runner-up
            for dropped in (best for best in self.kept if best not in kept):
                shutil.rmtree(self.location(dropped), ignore_errors=True)
            if kept[0] == candidate and self.best in kept:
                self.move(self.run_dir / BEST_CHECKPOINT_DIR, self.runner_up_dir(self.best.step))
        wait_for_everyone()  # before any process writes the model
        self.kept = kept
        directory = self.location(candidate)
        self.save_best(directory)  # every process: DeepSpeed gathers its shards here
        if is_main_process():
            record = {"step": step, "metric": self.metric, "value": value, METRIC: metrics[METRIC]}
            (directory / BEST_FILE).write_text(json.dumps(record))
        if kept[0] == candidate:
            log.info("Validation at step %d: %s %.3f, the best so far", step, self.metric, value)

    def resume_kept(self, step: int) -> None:
        """The kept models a resumed run carried, ranked by their validations; those of steps after `step` (trained
        again now) dropped; the best in checkpoint-best."""
        found, stale = {}, []
        for path in kept_checkpoints(self.run_dir):
            at = json.loads((path / BEST_FILE).read_text())["step"]
            value = next((m.get(self.metric) for s, m in self.validations if s == at), None)
            if at <= step and value is not None and value == value:
                found[Best(at, value)] = path
            else:
                stale.append(path)
        self.kept = sorted(found, key=lambda best: (-best.value, best.step))[: self.keep_top_k]
        wait_for_everyone()  # every process has read what was kept before the main process changes it
        if is_main_process():
            for path in stale:
                shutil.rmtree(path, ignore_errors=True)
            for best, path in found.items():
                if best not in self.kept:
                    shutil.rmtree(path, ignore_errors=True)
            if self.kept and found[self.kept[0]] != self.run_dir / BEST_CHECKPOINT_DIR:  # another metric ranked it
                holder = next((b for b, path in found.items() if path == self.run_dir / BEST_CHECKPOINT_DIR), None)
                if holder in self.kept:
                    self.move(self.run_dir / BEST_CHECKPOINT_DIR, self.runner_up_dir(holder.step))
                self.move(found[self.kept[0]], self.run_dir / BEST_CHECKPOINT_DIR)
        wait_for_everyone()

    def location(self, best: Best) -> Path:
        return self.run_dir / BEST_CHECKPOINT_DIR if best == self.best else self.runner_up_dir(best.step)

    def runner_up_dir(self, step: int) -> Path:
        return self.run_dir / TOP_CHECKPOINTS_DIR / f"step-{step}"

    @staticmethod
    def move(source: Path, target: Path) -> None:
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)

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

    def summary(self, run_dir: Path) -> dict:
        """For summary.json: the best validation (its step, the metric's value, held-out accuracy there), the kept
        checkpoints, why training stopped early, the alarm."""
        if self.best is None:
            return {}
        summary = {
            "best_step": self.best.step,
            "best_metric": self.metric,
            "best_value": self.best.value,
            "best_heldout_accuracy": self.metrics_at(self.best.step)[METRIC],
            "checkpoint_best": str(run_dir / BEST_CHECKPOINT_DIR),
            "stopped_early": self.stopped,
            "alarm": self.alarm,
        }
        if self.keep_top_k > 1:
            summary["top_k"] = [
                {"step": best.step, "value": best.value, "checkpoint": str(self.location(best))} for best in self.kept
            ]
        return summary


def check_validation(eval_cfg, trainer_cfg, learned: tuple[str, ...] = ()) -> None:
    """eval.every logs at a training step: one that TRL logs (trainer.logging_steps); what validations choose by
    (eval.best_metric) must be something they measure (`learned`: the mix's learned components)."""
    for key, role in (("patience", "stops on"), ("stop_at", "stops on"), ("every_samples", "samples at")):
        if eval_cfg[key] and not eval_cfg.every:
            raise UserError(f"eval.{key}={eval_cfg[key]} {role} validations: set eval.every too")
    for key, default in (("best_metric", METRIC), ("keep_top_k", 1)):
        if eval_cfg[key] != default and not eval_cfg.every:
            raise UserError(f"eval.{key}={eval_cfg[key]} chooses among validations: set eval.every too")
    if eval_cfg.every and eval_cfg.every % trainer_cfg.logging_steps:
        raise UserError(
            f"eval.every={eval_cfg.every} validates at steps that trainer.logging_steps={trainer_cfg.logging_steps} "
            "does not log: make eval.every a multiple of it"
        )
    measured = validation_metric_names(eval_cfg.every_samples, learned)
    if eval_cfg.best_metric not in measured:
        raise UserError(
            f"eval.best_metric={eval_cfg.best_metric} is not measured by this run's validations; they measure "
            f"{', '.join(measured)} (pass@k and maj@k with eval.every_samples=k; a learned component's mean and auroc "
            "when the reward mix has judge or confidence)"
        )
