"""Where the project's configs live: the repository's top-level `conf/` and `experiments/`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
REWARD_DIR = CONF_DIR / "reward"
MIX_SEPARATOR = "+"
FINAL_CHECKPOINT_DIR = "checkpoint-final"  # a run directory's final model (a run dir can name a model)


def reward_components() -> list[str]:
    """Names of the single reward components, one file each in conf/reward/."""
    return sorted(p.stem for p in REWARD_DIR.glob("*.yaml"))


def experiment_presets() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
