"""Experiment trackers (logger=wandb | trackio | tensorboard | mlflow), one module per backend behind TrackerRun.

A run opens with grpo_exp's identity (named by what differs, grouped by sweep, redacted config, tags); TRL's
`report_to` callback is attached to it; the Tracker (grpo_exp.run.tracking) holds it, hands grpo_exp's own
histograms and sample tables to it, adds the summary and finishes it."""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.run.trackers.base import RunInfo, TrackerRun
from grpo_exp.schema import LoggerBackend

__all__ = ["RunInfo", "TrackerRun", "open_run", "require"]


@dataclass(frozen=True)
class Backend:
    run: Callable[[], type[TrackerRun]]  # its TrackerRun, its module (and so its library) imported only when called
    library: str  # the module it imports
    package: str  # the package that provides it


# logger backend -> Backend, each registered beside the function that imports its run (`@tracker_backend(...)`)
BACKENDS: dict[LoggerBackend, Backend] = {}


def tracker_backend(backend: LoggerBackend, library: str, package: str | None = None) -> Callable:
    """Decorator: the function imports and returns logger=backend's TrackerRun; its module imports `library`, which
    `pip install <package>` provides (by default the library's own name), checked before any model loads."""

    def register(run: Callable[[], type[TrackerRun]]) -> Callable[[], type[TrackerRun]]:
        if backend in BACKENDS:
            raise ValueError(f"a logger backend {backend.value!r} is already registered")
        BACKENDS[backend] = Backend(run, library, package or library)
        return run

    return register


@tracker_backend(LoggerBackend.wandb, library="wandb")
def wandb_tracker() -> type[TrackerRun]:
    from grpo_exp.run.trackers.wandb_run import WandbRun

    return WandbRun


@tracker_backend(LoggerBackend.trackio, library="trackio")
def trackio_tracker() -> type[TrackerRun]:
    from grpo_exp.run.trackers.trackio_run import TrackioRun

    return TrackioRun


@tracker_backend(LoggerBackend.tensorboard, library="tensorboard")
def tensorboard_tracker() -> type[TrackerRun]:
    from grpo_exp.run.trackers.tensorboard_run import TensorBoardRun

    return TensorBoardRun


@tracker_backend(LoggerBackend.mlflow, library="mlflow", package="mlflow-skinny")
def mlflow_tracker() -> type[TrackerRun]:
    from grpo_exp.run.trackers.mlflow_run import MlflowRun

    return MlflowRun


def require(backend: LoggerBackend) -> None:
    """Before any model loads: the backend's library is installed, or one message saying how to get it."""
    module, package = BACKENDS[backend].library, BACKENDS[backend].package
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"logger={backend.value} needs {module}: pip install {package} (or pip install -e '.[trackers]')"
        )


def open_run(logger_cfg, info: RunInfo) -> TrackerRun:
    """Open the backend's run."""
    require(logger_cfg.backend)
    return BACKENDS[logger_cfg.backend].run()(logger_cfg, info)


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
