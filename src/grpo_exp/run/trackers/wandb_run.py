"""logger=wandb: a W&B run (online with an API key, offline otherwise); TRL's WandbCallback logs into it."""

import netrc
import os
from pathlib import Path

import numpy as np
import wandb

from grpo_exp.run.trackers.base import RunInfo, TrackerRun, table
from grpo_exp.schema import WandbMode


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def resolve_wandb_mode(mode: WandbMode) -> str:
    if mode is WandbMode.auto:
        return "online" if has_wandb_credentials() else "offline"
    return mode.value


class WandbRun(TrackerRun):
    def __init__(self, logger_cfg, info: RunInfo):
        self.mode = resolve_wandb_mode(logger_cfg.mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            name=info.name,
            group=info.group,
            job_type=info.job_type,
            tags=info.tags,
            config=info.config,
            mode=self.mode,
            dir=str(info.run_dir),
            id=info.run_id,
            resume="allow" if info.run_id else None,
        )

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        self.run.log({**{key: wandb.Histogram(v) for key, v in values.items()}, "train/global_step": step})

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        columns, data = table(rows)
        self.run.log({key: wandb.Table(columns=columns, data=data), "train/global_step": step})

    def summary(self, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def identity(self) -> dict:
        """Read back from the run, not from our arguments."""
        run = self.run
        return {"wandb_id": run.id, "wandb_name": run.name, "wandb_group": run.group, "wandb_job_type": run.job_type}

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def run_path(self) -> Path:
        return Path(self.run.dir).parent

    def where(self) -> str:
        return f"W&B run {self.run.name} ({self.mode} mode) in {self.run_path}"

    def sync_command(self) -> str | None:
        return f"wandb sync {self.run_path}" if self.mode == "offline" else None

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
