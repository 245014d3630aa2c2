"""What every tracker backend shares: a run's identity, the run now open (as `wandb.run` is W&B's), and the
interface grpo_exp logs through."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RunInfo:
    """Who a run is: name (what differs), sweep group, tags, the resolved config (secrets already redacted)."""

    name: str
    group: str | None
    tags: list[str]
    config: dict
    run_dir: Path
    run_id: str | None = None  # an earlier attempt's run, continued where the backend can
    job_type: str = "train"


class TrackerRun:
    """An open run of one backend. Each backend takes what it can; what it cannot take, these defaults drop."""

    mode = "enabled"

    def attach(self, trainer) -> None:
        """Make the trainer's report_to callback log into this run (its name and group), not a run of its own."""

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        """grpo_exp's distributions at an optimisation step (the per-group reward means and spreads)."""

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        """Rows of whole sampled groups (same keys in every row) at an optimisation step."""

    def summary(self, values: dict[str, float]) -> None:
        """The end-of-run numbers (summary.json's)."""

    def identity(self) -> dict:
        """The run's identity as the backend recorded it, for summary.json."""
        return {}

    @property
    def run_id(self) -> str | None:
        return None

    @property
    def run_path(self) -> Path | None:
        return None

    def where(self) -> str:
        """One line: where the run is and how to look at it."""
        return ""

    def sync_command(self) -> str | None:
        return None

    def finish(self, failed: bool) -> None:
        pass


def table(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Columns and cells of rows; a list cell (a multi-turn run's per-turn advantages) as its JSON text."""
    columns = list(rows[0])
    return columns, [[json.dumps(row[c]) if isinstance(row[c], list) else row[c] for c in columns] for row in rows]


def flatten(node: dict, prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"beta": 0.04}} -> {"trainer.beta": 0.04}; lists (and empty dicts) stay values."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class WithoutMissingValues:
    """Mixed into a report_to callback: leaves out the metrics without a value at this step (None: no correct
    answer to measure the length of, say), which TensorBoard's and MLflow's callbacks warn about at every step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = {key: value for key, value in (logs or {}).items() if value is not None}
        return super().on_log(args, state, control, logs=logs, **kwargs)


def replace_callback(trainer, kind: type, replacement) -> None:
    """Swap the trainer's callback of exactly this class for `replacement`, at its place in the order."""
    callbacks = trainer.callback_handler.callbacks
    for i, callback in enumerate(callbacks):
        if type(callback) is kind:
            callbacks[i] = replacement
