"""The steps every command (train, evaluate, probe) takes before its own work: the splits, the built parts (rewards,
verifier, rollout) with the rows checked, then the tokenizer and the policy model."""

from dataclasses import dataclass

import torch
from datasets import Dataset

from grpo_exp.data import load_splits
from grpo_exp.models import load_model, load_tokenizer
from grpo_exp.run.build import RunParts, build_parts
from grpo_exp.run.resolve import RunSpec

TRAINING, HELDOUT = "training", "held-out"


@dataclass
class Inputs:
    """A resolved config's splits and the parts built from it."""

    train: Dataset
    heldout: Dataset
    parts: RunParts


def set_up(spec: RunSpec, checked: tuple[str, ...] = ()) -> Inputs:
    """The splits and parts of `spec`; a rollout checks the rows of the `checked` splits (TRAINING, HELDOUT)."""
    train, heldout = load_splits(spec.cfg.dataset)
    parts = build_parts(spec, train["solution"])
    if parts.rollout is not None:
        splits = {TRAINING: train, HELDOUT: heldout}
        for name in checked:
            parts.rollout.check_rows(splits[name], name)
    return Inputs(train, heldout, parts)


def load_policy(spec: RunSpec, dtype: torch.dtype | None = None, tokenizer=None) -> tuple:
    """(the tokenizer, the policy model in `dtype`, None: model.dtype's); `tokenizer`: the one the caller loaded
    already (a quarter of a second a load), else loaded here."""
    cfg = spec.cfg
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir) if tokenizer is None else tokenizer
    return tokenizer, load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed, dtype)
