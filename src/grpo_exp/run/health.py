"""health.*: the policy's own health, watched at every logged step beside the reward-hacking alarm: its entropy
collapsing or blowing up, its completions cut at the length limit, no group with a reward spread, its answers
collapsing to one (grpo_exp.analysis.alarms' rules, each beyond its noise). What TRL logs, and the answers, are gathered
over the processes, so every process decides alike, and a stop stops them all."""

import logging
import statistics
from collections import deque
from pathlib import Path

from transformers import TrainerCallback

from grpo_exp.analysis.alarms import (
    MAX_COMPLETION,
    MAX_TURN,
    TURN_CUT,
    answer_collapse_alarm,
    entropy_alarm,
    no_signal_warning,
    truncation_warning,
)
from grpo_exp.config_rules import OnlyWith
from grpo_exp.run.tracking import read_metrics
from grpo_exp.schema import AlarmAction

log = logging.getLogger(__name__)

ENTROPY, CLIPPED, ZERO_STD = "entropy", "completions/clipped_ratio", "frac_reward_zero_std"  # TRL's metric names
ALL_WRONG = "groups/frac_all_wrong"
# Each alarm: (its health.* key, the metric it sets to 1 at the step it fires, its name in the log)
ALARMS = {
    "entropy_alarm": ("alarm/entropy", "Entropy alarm"),
    "truncation": ("alarm/truncation", "Truncation warning"),
    "no_signal": ("alarm/no_signal", "No learning signal"),
    "answer_collapse": ("alarm/answer_collapse", "Answer collapse"),
}


class PolicyHealth(TrainerCallback):
    """health.entropy_alarm, truncation, no_signal and answer_collapse: warn (log; its ALARMS metric = 1 in that
    step's logs, so it must see them first: GRPOExpTrainer.watch_logs_first; summary) or stop, the first time each
    fires.
    `completions_per_step`: what TRL's clipped ratio is a share of. A resumed run starts from its history
    (`metrics_file`)."""

    def __init__(self, health_cfg, completions_per_step: int, metrics_file: Path):
        self.cfg, self.completions_per_step, self.metrics_file = health_cfg, completions_per_step, metrics_file
        self.entropies: list[float] = []
        self.clipped: list[float] = []  # each step's share of completions cut (TRL's, or a multi-turn run's own)
        self.limit = MAX_COMPLETION  # the setting that cut them
        self.zero_std: list[float] = []
        self.all_wrong: list[float] = []
        # each recent step's (final answers, references) of every completion (observe_answers)
        self.answers: deque[tuple[list, list]] = deque(maxlen=health_cfg.window)
        self.fired: dict[str, str] = {}  # each alarm's message, once it fired (ALARMS' keys)
        self.stopped: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0 and self.metrics_file.is_file():
            for line in read_metrics(self.metrics_file):
                self.take(line)

    def observe_answers(self, answers: list[str | None], references: list[str | None]) -> None:
        """A generation batch's final answers (vote keys) and references, every process's (the trainer calls it)."""
        self.answers.append((answers, references))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self.take(logs):
            return
        cfg, window = self.cfg, self.cfg.window
        for key, check in (
            ("entropy_alarm", lambda: entropy_alarm(self.entropies, window, cfg.collapse_below, cfg.blowup_above)),
            (
                "truncation",
                lambda: truncation_warning(
                    self.clipped, self.completions_per_step, window, cfg.truncation_share, self.limit
                ),
            ),
            ("no_signal", self.no_signal),
            ("answer_collapse", self.answer_collapse),
        ):
            if key not in self.fired and AlarmAction(cfg[key]) is not AlarmAction.off:
                self.sound(key, check(), logs, state, control)

    def no_signal(self) -> str | None:
        found = no_signal_warning(self.zero_std, self.cfg.window)
        if found is None:
            return None
        wrong = self.all_wrong[-self.cfg.window :]
        if wrong and min(wrong) >= 1:
            found += "; every group was all wrong: the task is too hard, or the labels misread the answers"
        return found + f" (`grpo-exp diagnose {self.metrics_file.parent}` says what to try)"

    def answer_collapse(self) -> str | None:
        if len(self.answers) < self.cfg.window:
            return None
        answers = [a for step, _ in self.answers for a in step]
        references = [r for _, step in self.answers for r in step]
        return answer_collapse_alarm(answers, references, self.cfg.answer_collapse_share)

    def take(self, logs: dict) -> bool:
        """A training step's entropy, clipped ratio and groups without spread, if these logs are a step's."""
        if logs.get(ZERO_STD) is None and logs.get(ENTROPY) is None:  # not a training step's logs
            return False
        # entropy is None where no group trained (trainer.zero_variance_groups=skip left them all out)
        for key, values in (
            (ENTROPY, self.entropies),
            (TURN_CUT if TURN_CUT in logs else CLIPPED, self.clipped),
            (ZERO_STD, self.zero_std),
            (ALL_WRONG, self.all_wrong),
        ):
            if isinstance(logs.get(key), int | float):
                values.append(float(logs[key]))
        if TURN_CUT in logs:
            self.limit = MAX_TURN
        return True

    def sound(self, key: str, found: str | None, logs: dict, state, control) -> None:
        if found is None:
            return
        metric, name = ALARMS[key]
        message = f"step {state.global_step}: {found}"
        self.fired[key] = message
        logs[metric] = 1.0
        log.warning("%s at %s", name, message)
        if AlarmAction(self.cfg[key]) is AlarmAction.stop:
            self.stopped = f"{message} (health.{key}=stop)"
            control.should_training_stop = True

    def summary(self) -> dict:
        """For summary.json: what fired, and the numbers it watched (the first and last window's means)."""
        window = self.cfg.window

        def mean(values: list[float]) -> float | None:
            return statistics.fmean(values) if values else None

        return {
            "entropy_alarm": self.fired.get("entropy_alarm"),
            "truncation_warning": self.fired.get("truncation"),
            "no_signal_warning": self.fired.get("no_signal"),
            "answer_collapse_alarm": self.fired.get("answer_collapse"),
            "entropy_first": mean(self.entropies[:window]),
            "entropy_last": mean(self.entropies[-window:]),
            "clipped_ratio_last": mean(self.clipped[-window:]),
            **({"health_stopped": self.stopped} if self.stopped else {}),
        }


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("health.collapse_below", "health.blowup_above"),
        lambda cfg: cfg.health.entropy_alarm is not AlarmAction.off,
        "by the entropy alarm",
        lambda cfg: "health.entropy_alarm=off",
        "set health.entropy_alarm=warn or stop",
    ),
    OnlyWith(
        ("health.truncation_share",),
        lambda cfg: cfg.health.truncation is not AlarmAction.off,
        "by the truncation warning",
        lambda cfg: "health.truncation=off",
        "set health.truncation=warn or stop",
    ),
    OnlyWith(
        ("health.answer_collapse_share",),
        lambda cfg: cfg.health.answer_collapse is not AlarmAction.off,
        "by the answer-collapse alarm",
        lambda cfg: "health.answer_collapse=off",
        "set health.answer_collapse=warn or stop",
    ),
    OnlyWith(
        ("health.window",),
        lambda cfg: {cfg.health[key] for key in ALARMS} != {AlarmAction.off},
        "by the health alarms",
        lambda cfg: " and ".join(f"health.{key}=off" for key in ALARMS),
        "set one of them to warn or stop",
    ),
)
