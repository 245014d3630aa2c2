"""logger=tensorboard: event files in <run dir>/tensorboard/<run name>/, so that `tensorboard --logdir <sweep dir>`
shows a sweep's runs side by side (`<job>/tensorboard/<name>`). transformers' TensorBoardCallback writes TRL's
metrics through this run's writer; histograms as histograms, sample tables, the config and the summary as text."""

import hashlib
import json
import re

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from transformers.integrations import TensorBoardCallback

from grpo_exp.run.trackers.base import RunInfo, TrackerRun, WithoutMissingValues, replace_callback, table

MAX_DIR_NAME = 120  # file systems allow 255 bytes a name; a run named by many overrides is cut (and kept unique)


class RunWriterCallback(WithoutMissingValues, TensorBoardCallback):
    """TensorBoardCallback, writing through the run's writer (given at construction), which the Tracker closes
    (after the summary)."""

    def on_train_end(self, args, state, control, **kwargs):
        pass


class TensorBoardRun(TrackerRun):
    def __init__(self, logger_cfg, info: RunInfo):
        self.name = info.name
        self.log_dir = info.run_dir / "tensorboard" / directory_name(info.name)
        # `tensorboard --logdir` this: the sweep's directory (a job's run dir is <sweep dir>/<job>), else the run's
        self.dashboard_dir = info.run_dir.parent if info.group else self.log_dir.parent
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        identity = {"name": info.name, "group": info.group, "job_type": info.job_type, "tags": info.tags}
        self.writer.add_text("run", _code(json.dumps(identity, indent=2)))
        self.writer.add_text("config", _code(json.dumps(info.config, indent=2, default=str)))

    def attach(self, trainer) -> None:
        replace_callback(trainer, TensorBoardCallback, RunWriterCallback(tb_writer=self.writer))

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        for key, value in values.items():
            self.writer.add_histogram(key, value, step)

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        self.writer.add_text(key, markdown_table(rows), step)

    def summary(self, values: dict[str, float]) -> None:
        step = int(values.get("steps") or 0)
        for key, value in values.items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        self.writer.flush()

    def identity(self) -> dict:
        return {"tensorboard_dir": str(self.log_dir)}

    def where(self) -> str:
        return f"TensorBoard run {self.name} in {self.log_dir}; dashboard: tensorboard --logdir {self.dashboard_dir}"

    def finish(self, failed: bool) -> None:
        self.writer.close()


def directory_name(name: str) -> str:
    """The run's name as one directory name: no separators, at most MAX_DIR_NAME characters."""
    safe = re.sub(r"[/\\\x00]", "_", name)
    if len(safe) > MAX_DIR_NAME:
        safe = f"{safe[: MAX_DIR_NAME - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return safe


def markdown_table(rows: list[dict]) -> str:
    """TensorBoard's text dashboard renders markdown: one line a row, cells escaped."""
    columns, data = table(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in data]
    return "\n".join(lines)


def _cell(value) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", "<br>")


def _code(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())  # markdown code block: shown as written
