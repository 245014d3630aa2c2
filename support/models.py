"""The tiny random model (model=tiny) on disk, loadable like any pretrained model directory."""

from pathlib import Path

from grpo_exp.models import build_tiny_model, load_tokenizer
from support.config import TINY_RUN, compose_config


def write_tiny_model(directory: Path, seed: int) -> Path:
    """Save the tiny random model, its weights drawn with `seed`, and its tokenizer in `directory`; returns it.
    A tiny training run builds its model with trainer.seed (42 by default)."""
    cfg = compose_config(TINY_RUN)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    build_tiny_model(cfg.model, tokenizer, seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)
