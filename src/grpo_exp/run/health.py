"""health.*: the policy's own health, watched at every logged step beside the reward-hacking alarm: its entropy
collapsing or blowing up, its completions cut at the length limit (grpo_exp.run.alarms' rules, each beyond its
noise). What TRL logs is gathered over the processes, so every process decides alike, and a stop stops them all."""

import logging
import statistics
from pathlib import Path

from transformers import TrainerCallback

from grpo_exp.run.alarms import entropy_alarm, truncation_warning
from grpo_exp.run.tracking import read_metrics
from grpo_exp.schema import AlarmAction

log = logging.getLogger(__name__)

ENTROPY, CLIPPED = "entropy", "completions/clipped_ratio"  # TRL's metric names


class PolicyHealth(TrainerCallback):
    """health.entropy_alarm and health.truncation: warn (log; alarm/entropy or alarm/truncation = 1 in that step's
    logs, so it must see them first: GRPOExpTrainer.watch_logs_first; summary) or stop, the first time each fires.
    `completions_per_step`: what TRL's clipped ratio is a share of. A resumed run starts from its history
    (`metrics_file`)."""

    def __init__(self, health_cfg, completions_per_step: int, metrics_file: Path):
        self.cfg, self.completions_per_step, self.metrics_file = health_cfg, completions_per_step, metrics_file
        self.entropies: list[float] = []
        self.clipped: list[float] = []
        self.entropy: str | None = None  # the entropy alarm, once it fired
        self.truncation: str | None = None  # the truncation warning, once it fired
        self.stopped: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0 and self.metrics_file.is_file():
            for line in read_metrics(self.metrics_file):
                self.take(line)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self.take(logs):
            return
        window = self.cfg.window
        if self.entropy is None and AlarmAction(self.cfg.entropy_alarm) is not AlarmAction.off:
            found = entropy_alarm(self.entropies, window, self.cfg.collapse_below, self.cfg.blowup_above)
            self.entropy = self.sound("alarm/entropy", found, "entropy_alarm", logs, state, control)
        if self.truncation is None and AlarmAction(self.cfg.truncation) is not AlarmAction.off:
            found = truncation_warning(self.clipped, self.completions_per_step, window, self.cfg.truncation_share)
            self.truncation = self.sound("alarm/truncation", found, "truncation", logs, state, control)

    def take(self, logs: dict) -> bool:
        """A training step's entropy and clipped ratio, if these logs carry them."""
        if logs.get(ENTROPY) is None:
            return False
        self.entropies.append(float(logs[ENTROPY]))
        if logs.get(CLIPPED) is not None:
            self.clipped.append(float(logs[CLIPPED]))
        return True

    def sound(self, metric: str, found: str | None, key: str, logs: dict, state, control) -> str | None:
        if found is None:
            return None
        message = f"step {state.global_step}: {found}"
        logs[metric] = 1.0
        log.warning("%s at %s", "Entropy alarm" if metric == "alarm/entropy" else "Truncation warning", message)
        if AlarmAction(self.cfg[key]) is AlarmAction.stop:
            self.stopped = f"{message} (health.{key}=stop)"
            control.should_training_stop = True
        return message

    def summary(self) -> dict:
        """For summary.json: what fired, and the numbers it watched (the first and last window's means)."""
        window = self.cfg.window

        def mean(values: list[float]) -> float | None:
            return statistics.fmean(values) if values else None

        return {
            "entropy_alarm": self.entropy,
            "truncation_warning": self.truncation,
            "entropy_first": mean(self.entropies[:window]),
            "entropy_last": mean(self.entropies[-window:]),
            "clipped_ratio_last": mean(self.clipped[-window:]),
            **({"health_stopped": self.stopped} if self.stopped else {}),
        }
