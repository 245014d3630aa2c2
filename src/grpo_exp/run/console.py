"""The live console view of a training job: a progress bar and, per logging step, one line of the metrics a user
watches (every metric still goes to metrics.jsonl and W&B)."""

import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback


def format_step(
    logs: Mapping[str, Any],
    step: int,
    max_steps: int,
    heldout_before: float | None = None,
    seconds_per_step: float | None = None,
) -> str | None:
    """One line for a training step's log event; None for other events (the final train_runtime summary)."""
    if "reward" not in logs:
        return None
    components = [
        f"{key.removeprefix('rewards/').removesuffix('/mean')} {_number(value)}"
        for key, value in logs.items()
        if key.startswith("rewards/") and key.endswith("/mean")
    ]
    reward = f"reward {_number(logs['reward'])}" + (f" ({', '.join(components)})" if components else "")
    parts = [f"step {step}/{max_steps}", reward]
    if "frac_reward_zero_std" in logs:  # groups with no reward spread: no advantage, no learning signal
        parts.append(f"frac_zero_std {_number(logs['frac_reward_zero_std'], '.2f')}")
    if "resample/batches" in logs:  # zero_variance_groups=resample: generation batches this step took
        parts.append(f"batches {_number(logs['resample/batches'], '.0f')}")
    if "kl" in logs:  # TRL logs it only when beta > 0
        parts.append(f"kl {_number(logs['kl'], '.3g')}")
    if heldout_before is not None:
        parts.append(f"held-out before {heldout_before:.3f}")
    if isinstance(logs.get("heldout/accuracy"), float):  # eval.every: this step's validation
        parts.append(f"held-out now {logs['heldout/accuracy']:.3f}")
    if seconds_per_step is not None:
        eta = timedelta(seconds=round(seconds_per_step * max(max_steps - step, 0)))
        parts.append(f"{seconds_per_step:.2f} s/step, ETA {eta}")
    return " | ".join(parts)


def _number(value: Any, spec: str = ".3f") -> str:
    """TRL logs None for a metric with no valid value (a reward function that scored nothing)."""
    if not isinstance(value, int | float) or math.isnan(value):
        return "n/a"
    return format(value, spec)


class ConsoleView(TrainerCallback):
    """Replaces transformers' ProgressCallback/PrinterCallback, whose dump of the whole metric dict (50+ keys)
    buries the bar. heldout_before(): the held-out accuracy before training, once measured (else None)."""

    def __init__(self, heldout_before: Callable[[], float | None] | None = None):
        self.heldout_before = heldout_before or (lambda: None)
        self.bar = None
        self.last_log: tuple[float, int] | None = None  # (time, step): seconds per step since the previous line

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            # initial: a resumed run starts at its checkpoint's step
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="train", dynamic_ncols=True)
            self.last_log = (time.perf_counter(), state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        seconds_per_step = None
        now = time.perf_counter()
        if self.last_log and state.global_step > self.last_log[1]:
            seconds_per_step = (now - self.last_log[0]) / (state.global_step - self.last_log[1])
        line = format_step(logs, state.global_step, state.max_steps, self.heldout_before(), seconds_per_step)
        if line:
            self.last_log = (now, state.global_step)
            tqdm.write(line)  # above the bar, which is redrawn below it

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
