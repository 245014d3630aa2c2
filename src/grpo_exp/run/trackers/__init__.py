"""Experiment trackers (logger=wandb | trackio | tensorboard | mlflow), one module per backend behind TrackerRun.

A run opens with grpo_exp's identity (named by what differs, grouped by sweep, redacted config, tags); TRL's
`report_to` callback is attached to it; the Tracker (grpo_exp.run.tracking) holds it, hands grpo_exp's own
histograms and sample tables to it, adds the summary and finishes it."""

import importlib
import importlib.util

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.run.trackers.base import RunInfo, TrackerRun
from grpo_exp.schema import LoggerBackend

__all__ = ["RunInfo", "TrackerRun", "open_run", "require"]

# backend: (its module here, its class, the module it imports, the package that provides it)
BACKENDS = {
    LoggerBackend.wandb: ("wandb_run", "WandbRun", "wandb", "wandb"),
    LoggerBackend.trackio: ("trackio_run", "TrackioRun", "trackio", "trackio"),
    LoggerBackend.tensorboard: ("tensorboard_run", "TensorBoardRun", "tensorboard", "tensorboard"),
    LoggerBackend.mlflow: ("mlflow_run", "MlflowRun", "mlflow", "mlflow-skinny"),
}


def require(backend: LoggerBackend) -> None:
    """Before any model loads: the backend's library is installed, or one message saying how to get it."""
    _, _, module, package = BACKENDS[backend]
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"logger={backend.value} needs {module}: pip install {package} (or pip install -e '.[trackers]')"
        )


def open_run(logger_cfg, info: RunInfo) -> TrackerRun:
    """Open the backend's run."""
    require(logger_cfg.backend)
    module, name, _, _ = BACKENDS[logger_cfg.backend]
    kind = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return kind(logger_cfg, info)


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("logger.entity",),
        lambda cfg: cfg.logger.backend is LoggerBackend.wandb,
        "by W&B (logger=wandb)",
        lambda cfg: f"logger.backend={cfg.logger.backend.value}",
        "use logger=wandb",
    ),
    OnlyWith(
        ("logger.tracking_uri",),
        lambda cfg: cfg.logger.backend is LoggerBackend.mlflow,
        "by MLflow (logger=mlflow)",
        lambda cfg: f"logger.backend={cfg.logger.backend.value}",
        "use logger=mlflow",
    ),
    OnlyWith(
        ("logger.project", "logger.tags"),
        lambda cfg: cfg.logger.backend is not LoggerBackend.none,
        "by a tracker (logger=wandb, trackio, tensorboard or mlflow)",
        lambda cfg: "logger.backend=none logs to none",
        "choose a logger",
    ),
)
