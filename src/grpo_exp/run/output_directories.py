"""A Hydra callback: the directories a training run writes to are checked before Hydra creates them, so that one the
operating system refuses (a file in the way, no permission, /sys, a read-only mount) is one message naming the setting
the user wrote, not a traceback from Hydra's mkdir.

The run (or sweep) directory lies below outputs_dir unless hydra.run.dir (hydra.sweep.dir) is given; cache_dir holds
the materialised models.
"""

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.run_files import check_output_directories


def written_as(cfg: DictConfig, *keys: str) -> str:
    """The first of `keys` that the user wrote on the command line, as written (`outputs_dir=/data/out`), else the last
    as the config holds it (outputs_dir, the default run directory's parent)."""
    overrides = [*cfg.hydra.overrides.hydra, *cfg.hydra.overrides.task]
    for key in keys:
        for override in overrides:
            if override.partition("=")[0].lstrip("+~") == key:
                return override
    return f"{keys[-1]}={OmegaConf.select(cfg, keys[-1])}"


def refuse_unwritable(config: DictConfig, directory_key: str) -> None:
    """Exits with the message when the run's (sweep's) directory or cache_dir cannot be written. Hydra turns a
    callback's exceptions into warnings and goes on to its own mkdir: a SystemExit is not one of them."""
    try:
        check_output_directories(
            {
                written_as(config, directory_key, "outputs_dir"): Path(OmegaConf.select(config, directory_key)),
                written_as(config, "cache_dir"): Path(config.cache_dir),
            }
        )
    except UserError as err:
        raise SystemExit(f"Error: {err}") from None


class OutputDirectories(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        refuse_unwritable(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse_unwritable(config, "hydra.sweep.dir")
