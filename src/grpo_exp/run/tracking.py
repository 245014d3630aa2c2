"""Experiment tracking: a run's identity (name, sweep group, redacted config), the tracker run of a training job
(logger=wandb | trackio | tensorboard | mlflow: grpo_exp.run.trackers), and a local metrics file readable without
any of them."""

import json
import logging
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf
from transformers import TrainerCallback

from grpo_exp.redaction import REDACTED, is_secret_key, redact
from grpo_exp.run import trackers
from grpo_exp.run_files import read_jsonl, read_metrics  # noqa: F401  (read_metrics: tracking's record, read here too)
from grpo_exp.schema import LoggerBackend, WandbMode

log = logging.getLogger(__name__)

# Overrides that say where or how a run is kept, not what it is: left out of its name.
BOOKKEEPING = ("hydra.", "outputs_dir=", "trainer.resume=")


def run_name(task_overrides: list[str], swept: set[str] | None = None) -> str:
    """A run is named by what differs: in a sweep, its values of the swept keys; else its overrides (a secret's
    value masked: the name goes to every tracker)."""
    overrides = [o.lstrip("+~") for o in task_overrides if not o.lstrip("+~").startswith(BOOKKEEPING)]
    if swept:
        overrides = [o for o in overrides if o.split("=", 1)[0] in swept]
    return ",".join(map(masked_override, overrides)) or "defaults"


def masked_override(override: str) -> str:
    """An override as given, a secret's value masked (judge.api_key=..., a URL's credentials)."""
    key, equals, _ = override.partition("=")
    return redact(f"{key}={REDACTED}" if equals and is_secret_key(key.rsplit(".", 1)[-1]) else override)


def swept_keys(sweep_overrides: list[str], sweeper_params: dict | None = None) -> set[str]:
    """The keys a multirun sweeps: command-line overrides with several values, and hydra.sweeper.params."""
    parsed = OverridesParser.create().parse_overrides(sweep_overrides)
    return {o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()} | set(sweeper_params or {})


def run_identity(hydra_cfg) -> tuple[str, str | None]:
    """(run name, group) for every tracker: a sweep is one group, named after its directory; its runs by what
    differs."""
    task = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return run_name(task), None
    sweep_dir = Path(hydra_cfg.sweep.dir)
    sweep_record = sweep_dir / "multirun.yaml"  # written by Hydra when the sweep starts: the original overrides
    # The sweeper's own params (Optuna writes no multirun.yaml), and the original command line's sweeps.
    params = OmegaConf.select(hydra_cfg, "sweeper.params")
    swept: set[str] = set(OmegaConf.to_container(params)) if params else set()
    if sweep_record.is_file():
        record = OmegaConf.load(sweep_record)
        params = OmegaConf.select(record, "hydra.sweeper.params")
        swept |= swept_keys(list(record.hydra.overrides.task), OmegaConf.to_container(params) if params else None)
    try:
        group = sweep_dir.resolve().relative_to(Path.cwd()).as_posix()
    except ValueError:
        group = sweep_dir.as_posix()
    return run_name(task, swept), group[-128:]


class MetricsFileCallback(TrainerCallback):
    """Appends every log event of the trainer to <run dir>/metrics.jsonl (flushed: nothing lost on a crash)."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            record = {"step": state.global_step, **{k: v for k, v in logs.items() if _is_scalar(v)}}
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, int | float | str | bool) or value is None


def report_to(logger_cfg) -> str:
    """The `report_to` of TRL's config: its callback for the backend logs into the run the Tracker opens."""
    if logger_cfg.backend is LoggerBackend.none or logger_cfg.mode is WandbMode.disabled:
        return "none"
    trackers.require(logger_cfg.backend)
    return logger_cfg.backend.value


class Tracker:
    """The tracker run of one job (logger=wandb | trackio | tensorboard | mlflow; a no-op with logger=none): opened
    with the run's name, sweep group, tags and redacted config, given the summary, finished even on failure."""

    def __init__(
        self,
        logger_cfg,
        run_dir: Path,
        name: str,
        group: str | None,
        tags: list[str],
        config: dict,
        run_id: str | None = None,
        enabled: bool = True,
        job_type: str = "train",
    ):
        """run_id: an earlier attempt's run, continued (resumed) rather than duplicated where the backend can.
        enabled=False on all but the main process of a multi-process run."""
        self.run: trackers.TrackerRun | None = None
        if report_to(logger_cfg) == "none" or not enabled:
            return
        info = trackers.RunInfo(
            name=name,
            group=group,
            tags=[*logger_cfg.tags, *tags],
            config=redact(config),
            run_dir=run_dir,
            run_id=run_id,
            job_type=job_type,
        )
        self.run = trackers.open_run(logger_cfg, info)
        log.info("%s", self.run.where())

    @property
    def mode(self) -> str:
        return "disabled" if self.run is None else self.run.mode

    @property
    def run_id(self) -> str | None:
        return None if self.run is None else self.run.run_id

    @property
    def run_path(self) -> Path | None:
        """The W&B run's directory (what summary.json calls `wandb`)."""
        return None if self.run is None else self.run.run_path

    def identity(self) -> dict:
        """The run's name and group as the tracker recorded them (read back from the run where it can be)."""
        return {} if self.run is None else self.run.identity()

    def summary(self, values: dict) -> None:
        if self.run is not None:
            self.run.summary(values)

    def sync_command(self) -> str | None:
        return None if self.run is None else self.run.sync_command()

    def attach(self, trainer) -> None:
        """TRL's report_to callback of `trainer` logs into this run (its name, group)."""
        if self.run is not None:
            self.run.attach(trainer)

    def log_histograms(self, step: int, values: dict) -> None:
        if self.run is not None:
            self.run.log_histograms(step, values)

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        if self.run is not None:
            self.run.log_table(step, key, rows)

    def finish(self, failed: bool) -> None:
        if self.run is not None:
            self.run.finish(failed)
