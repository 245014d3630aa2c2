"""A saved model's weights loaded into the policy already built (the warmed model of an earlier attempt)."""

from pathlib import Path

from safetensors.torch import load_file

from grpo_exp.errors import UserError
from grpo_exp.models import saved_weight_files


def load_weights(model, directory: Path) -> None:
    """save_pretrained's safetensors (one file or shards) into `model`; tied weights, saved once, are tied again."""
    paths = saved_weight_files(directory)
    if not all(path.is_file() for path in paths):
        raise UserError(f"trainer.resume: the warmed model in {directory} is incomplete; start the run afresh")
    state = {}
    for path in paths:
        state |= load_file(str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or any(key not in tied for key in missing):
        raise UserError(
            f"trainer.resume: the warmed model in {directory} does not fit this run's model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    model.tie_weights()
