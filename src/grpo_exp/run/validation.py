"""eval.every: held-out validation while training, early stopping and the alarms.

Every eval.every steps the policy answers eval.every_problems held-out problems greedily (every process a share);
the accuracy is logged at that step as heldout/accuracy, beside the training reward (metrics.jsonl, every
tracker, the console). Each validation is offered to the kept models (grpo_exp.run.kept_models: checkpoint-best and
the top k by eval.best_metric), may stop training early (eval.patience, eval.stop_at) and may sound the
reward-hacking alarm (grpo_exp.analysis.alarms). A resumed run starts from its history and the models it kept.
"""

import logging
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from grpo_exp.analysis.alarms import hacking_alarm, labelled
from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.measures import accuracy_standard_error, auroc_standard_error
from grpo_exp.run.kept_models import METRIC, Best, KeptModels
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import METRICS_FILE
from grpo_exp.schema import AlarmAction

log = logging.getLogger(__name__)


def validation_metric_names(samples: int, learned: tuple[str, ...], environments: tuple[str, ...] = ()) -> list[str]:
    """What a validation logs: held-out accuracy; pass@1..k and maj@k with eval.every_samples=k; each learned
    component's held-out mean and AUROC; each environment's success rate and mean reward. Pure."""
    names = [METRIC]
    if samples:
        names += [f"heldout/pass@{k}" for k in range(1, samples + 1)] + [f"heldout/maj@{samples}"]
    names += [f"heldout/environment/{name}/{stat}" for name in environments for stat in ("success", "reward_mean")]
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


@contextmanager
def untouched_rng():
    """Evaluation inside training (which may sample) leaves the random state as it was: training goes on exactly
    as without it."""
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
        yield


@dataclass(frozen=True)
class Schedule:
    """When validations run and what they may stop (eval.*): every `every` steps on `problems` problems."""

    every: int
    problems: int
    patience: int | None = None
    stop_at: float | None = None
    alarm: AlarmAction = AlarmAction.warn

    @classmethod
    def of(cls, eval_cfg, problems: int) -> "Schedule":
        return cls(eval_cfg.every, problems, eval_cfg.patience, eval_cfg.stop_at, AlarmAction(eval_cfg.alarm))


class PeriodicValidation(TrainerCallback):
    """Validates with `validate()` (every process; returns metrics, METRIC among them, the same on every process):
    the initial model when training begins (`initial()`, step 0, unless a resumed run carries it), then every
    `schedule.every` steps. Each validation's metrics go to `log_now(metrics)` at step 0 (there is no training step
    to log them with) and to `record(key, value)` later (the trainer's metric store, logged at that step); each is
    offered to the `kept` models, the initial model's included, so checkpoint-best is never worse than where
    training started."""

    def __init__(
        self,
        schedule: Schedule,
        validate: Callable[[], dict[str, float]],
        record: Callable[[str, float], None],
        log_now: Callable[[dict[str, float]], None],
        kept: KeptModels,
        learned: tuple[str, ...] = (),
        initial: Callable[[], dict[str, float]] | None = None,
    ):
        """initial: the initial model's metrics when already measured (the evaluation before training, on these
        problems); else validate() measures them. learned: the mix's learned components, which the alarm watches."""
        self.schedule, self.validate, self.record, self.log_now = schedule, validate, record, log_now
        self.kept, self.learned = kept, learned
        self.initial = initial or validate
        # (step, metrics), a resumed run's earlier ones included
        self.validations: list[tuple[int, dict[str, float]]] = []
        self.stopped: str | None = None  # why it stopped training early, if it did
        self.alarm: str | None = None  # the reward-hacking alarm, once it fired
        self.seconds = 0.0  # spent validating (and keeping the best models) inside trainer.train(): not training

    @property
    def metric(self) -> str:
        return self.kept.metric

    def metrics_at(self, step: int) -> dict[str, float]:
        return next(metrics for at, metrics in self.validations if at == step)

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run's history (carried into its metrics; read once every process has passed a collective since
        the main process wrote it) and the models it kept; else the initial model's validation, at step 0.

        Only a resumed run (global_step > 0) reads the file: in a fresh run the main process writes it at step 0,
        and a process that read it after that would take itself for a resumed one, keep other checkpoints than the
        main process, and wait in a barrier the others never reach."""
        metrics_file = self.kept.run_dir / METRICS_FILE
        history = read_metrics(metrics_file) if state.global_step > 0 and metrics_file.is_file() else []
        self.validations = [
            (line["step"], {key: value for key, value in line.items() if key.startswith("heldout/")})
            for line in history
            if line.get(METRIC) is not None
        ]
        if self.validations:
            self.kept.resume(state.global_step, self.validations)
        else:
            started = time.perf_counter()
            with untouched_rng():
                metrics = self.initial()
            self.log_now(metrics)
            self.keep(state.global_step, metrics)
            self.seconds += time.perf_counter() - started

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.schedule.every:
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
        reason = stop_reason(values, errors, self.schedule.patience, self.schedule.stop_at, self.metric)
        self.seconds += time.perf_counter() - started
        if reason:  # the same on every process: the accuracy is gathered
            self.stopped = f"step {state.global_step}: {reason}"
            control.should_training_stop = True
            log.warning("Training stops early at %s", self.stopped)

    def standard_error(self, metrics: dict[str, float]) -> float:
        if metrics.get(self.metric) is None or metrics[self.metric] != metrics[self.metric]:
            return math.nan
        return metric_standard_error(self.metric, metrics, self.schedule.problems)

    def keep(self, step: int, metrics: dict[str, float]) -> None:
        """The validation in the history, offered to the kept models."""
        self.validations.append((step, metrics))
        self.kept.offer(step, metrics)
        if self.kept.best == Best(step, metrics.get(self.metric)):
            log.info("Validation at step %d: %s %.3f, the best so far", step, self.metric, self.kept.best.value)

    def check_alarm(self, state, control) -> None:
        """eval.alarm: warn (log, console, summary.json) or stop, the first time the alarm fires."""
        if self.schedule.alarm is AlarmAction.off or self.alarm:
            return
        rewards = [(line["step"], line["reward"]) for line in state.log_history if line.get("reward") is not None]
        found = hacking_alarm(rewards, self.validations, self.schedule.problems, self.learned)
        if found:  # the same on every process: the rewards TRL logs and the validations are gathered
            self.alarm = f"step {state.global_step}: {found}"
            self.record("alarm/reward_hacking", 1.0)
            log.warning("Reward-hacking alarm at %s", self.alarm)
            if self.schedule.alarm is AlarmAction.stop:
                self.stopped = f"{self.alarm} (eval.alarm=stop)"
                control.should_training_stop = True

    def summary(self) -> dict:
        """For summary.json: the best validation (its step, the metric's value, held-out accuracy there), the kept
        checkpoints, why training stopped early, the alarm."""
        best = self.kept.best
        if best is None:
            return {}
        return {
            "best_step": best.step,
            "best_metric": self.metric,
            "best_value": best.value,
            "best_heldout_accuracy": self.metrics_at(best.step)[METRIC],
            **self.kept.summary(),
            "stopped_early": self.stopped,
            "alarm": self.alarm,
        }


def check_validation(eval_cfg, trainer_cfg, learned: tuple[str, ...] = (), environments: tuple[str, ...] = ()) -> None:
    """eval.every logs at a training step: one that TRL logs (trainer.logging_steps); what validations choose by
    (eval.best_metric) must be something they measure (`learned`: the mix's learned components; `environments`: the
    run's environments, by name)."""
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
    measured = validation_metric_names(eval_cfg.every_samples, learned, environments)
    if eval_cfg.best_metric not in measured:
        raise UserError(
            f"eval.best_metric={eval_cfg.best_metric} is not measured by this run's validations; they measure "
            f"{', '.join(measured)} (pass@k and maj@k with eval.every_samples=k; a learned component's mean and auroc "
            "when the reward mix has judge or confidence)"
        )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        tuple(
            f"eval.{key}"
            for key in ("every_problems", "every_samples", "best_metric", "keep_top_k", "patience", "stop_at", "alarm")
        ),
        lambda cfg: bool(cfg.eval.every),
        "by validations while training (eval.every=N)",
        lambda cfg: "eval.every=0 runs none",
        "set eval.every too",
    ),
)
