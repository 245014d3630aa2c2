"""Environment settings for offline runs, set by whoever needs them (pytest's configure hook, a benchmark's main)."""

import os


def hub_offline() -> None:
    """No Hugging Face Hub: a lookup fails fast instead of retrying for half a minute. An explicit setting in the
    environment wins. It holds in this process only when set before huggingface_hub and datasets are imported
    (they read it at import); child processes started afterwards inherit it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def without_wandb_key() -> None:
    """W&B never reaches its server: logger.mode=auto logs offline when no WANDB_API_KEY is set."""
    os.environ.pop("WANDB_API_KEY", None)
