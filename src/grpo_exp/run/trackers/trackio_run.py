"""logger=trackio: a run in trackio's local store (one SQLite database per project in $TRACKIO_DIR, default
~/.cache/huggingface/trackio), in logger.project, grouped by sweep; `trackio show --project <project>` opens it.

transformers' TrackioCallback would open a run of its own (no group, TrainingArguments' project) and number its
points by log call; it is swapped for one that logs into this run at the optimisation step (as TensorBoard and
MLflow plot it). $TRACKIO_DIR is read when trackio is imported (TRL imports it): set it in the environment, not in
the config."""

import numpy as np
import trackio
from transformers.integrations import TrackioCallback
from transformers.integrations.integration_utils import rewrite_logs

from grpo_exp.run.trackers.base import RunInfo, TrackerRun, flatten, replace_callback, table


class OpenedRunCallback(TrackioCallback):
    """TrackioCallback, logging into the run already open, at the optimisation step; the Tracker finishes the run
    (after the summary)."""

    def setup(self, args, state, model, **kwargs):
        self._initialized = True

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            trackio.log(rewrite_logs(logs), step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        pass


class TrackioRun(TrackerRun):
    def __init__(self, logger_cfg, info: RunInfo):
        self.project = logger_cfg.project
        self.run = trackio.init(
            project=self.project,
            name=info.name,
            group=info.group,
            # flat: the dashboard groups runs by a top-level key (the sweep, trainer.beta, choices.reward, ...)
            config={**flatten(info.config), "group": info.group, "tags": info.tags, "job_type": info.job_type},
            resume="allow" if info.run_id else "never",  # a resumed attempt continues its run (by name)
        )

    def attach(self, trainer) -> None:
        replace_callback(trainer, TrackioCallback, OpenedRunCallback())

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        trackio.log({key: trackio.Histogram(v) for key, v in values.items()}, step=step)

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        columns, data = table(rows)
        trackio.log({key: trackio.Table(columns=columns, data=data)}, step=step)

    def summary(self, values: dict[str, float]) -> None:
        trackio.log({f"summary/{key}": value for key, value in values.items()})

    def identity(self) -> dict:
        run = self.run
        return {"trackio_project": run.project, "trackio_name": run.name, "trackio_group": run.group}

    @property
    def run_id(self) -> str:
        return self.run.id

    def where(self) -> str:
        return (
            f"trackio run {self.run.name} in project {self.project} ({trackio.TRACKIO_DIR}); "
            f'dashboard: trackio show --project "{self.project}"'
        )

    def finish(self, failed: bool) -> None:
        trackio.finish()
