"""Config -> TRL's GRPOConfig, with batch sizes derived so that any group size is valid."""

import dataclasses
import difflib
import importlib.util
import typing
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from trl import GRPOConfig

from grpo_exp.errors import UserError

# TrainerSchema keys that are grpo_exp's own, not GRPOConfig fields.
OWN_KEYS = {
    "prompts_per_step",
    "extra",
    "keep_checkpoints",
    "resume",
    "zero_variance_groups",
    "max_resample_batches",
    "shared_prompt_forward",
    "bfloat16_generation",
    "fast_generation",
}


def check_trainer(trainer_cfg: DictConfig, processes: int = 1) -> None:
    """The checks GRPOConfig would make later (after the model loaded), made early and naming our keys (the
    schema's own value checks, grpo_exp.schema.check_values, come first)."""
    if (trainer_cfg.prompts_per_step * trainer_cfg.num_generations) % processes:
        raise UserError(
            f"trainer.prompts_per_step * trainer.num_generations = "
            f"{trainer_cfg.prompts_per_step * trainer_cfg.num_generations} completions per step cannot be split "
            f"evenly over {processes} processes: change trainer.prompts_per_step"
        )
    check_sampling_copy(trainer_cfg)
    if trainer_cfg.extra.get("use_vllm"):
        check_vllm()
    check_zero_variance_groups(trainer_cfg, processes)
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    for key, value in trainer_cfg.extra.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3)
            raise UserError(
                f"trainer.extra.{key} is not a GRPOConfig field" + (f"; did you mean {close}?" if close else "")
            )
        if key in trainer_cfg:
            raise UserError(f"trainer.extra.{key}: set it as trainer.{key}")
        if key in DERIVED:
            raise UserError(
                f"trainer.extra.{key} is derived from trainer.prompts_per_step and trainer.num_generations; "
                "set those instead"
            )
        _check_extra_value(key, value)


def check_zero_variance_groups(trainer_cfg: DictConfig, processes: int) -> None:
    mode = trainer_cfg.zero_variance_groups
    mode = getattr(mode, "value", mode)
    if mode == "keep":
        return
    if mode == "resample" and processes > 1:
        raise UserError(
            f"trainer.zero_variance_groups=resample runs in one process only (this run has {processes}): "
            "use zero_variance_groups=skip"
        )


def check_sampling_copy(trainer_cfg: DictConfig) -> None:
    """bfloat16_generation and fast_generation replace TRL's transformers generate(); the other generation paths
    sample elsewhere."""
    presets = {"bfloat16_generation": "transformers_bf16", "fast_generation": "transformers_fast"}
    for option in [name for name in presets if trainer_cfg[name]]:
        for key, path in (("use_vllm", "vLLM samples"), ("use_transformers_paged", "continuous batching samples")):
            if trainer_cfg.extra.get(key):
                raise UserError(
                    f"trainer.{option}=true is a transformers generation path (generation={presets[option]}), "
                    f"but trainer.extra.{key}=true: {path} instead. Use one of them"
                )


# Pass-through fields with a fixed set of values that TRL only checks mid-training (the seam mirrors this one).
EXTRA_CHOICES = {"multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum")}
SIMPLE_TYPES = (bool, int, float, str, type(None))


def _check_extra_value(key: str, value) -> None:
    """A pass-through value against the type GRPOConfig declares for it (where that type is a plain one)."""
    if key in EXTRA_CHOICES and value not in EXTRA_CHOICES[key]:
        raise UserError(f"trainer.extra.{key}='{value}' is not one of {list(EXTRA_CHOICES[key])}")
    declared = typing.get_args(GRPO_FIELD_TYPES[key]) or (GRPO_FIELD_TYPES[key],)
    if not all(t in SIMPLE_TYPES for t in declared) or any(_is_instance(value, t) for t in declared):
        return
    names = " or ".join("null" if t is type(None) else t.__name__ for t in declared)
    raise UserError(f"trainer.extra.{key}={value!r}: GRPOConfig expects {names}")


def _is_instance(value, declared: type) -> bool:
    if declared is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if declared is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, declared)


GRPO_FIELD_TYPES = typing.get_type_hints(GRPOConfig)


# Batch fields grpo_exp derives: one generation batch of prompts_per_step groups per optimisation step.
DERIVED = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "generation_batch_size",
    "steps_per_generation",
}


def check_vllm() -> None:
    """TRL's vLLM generation (generation=vllm_*) needs the vllm package and a CUDA GPU: say so before loading."""
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        raise UserError(
            "trainer.extra.use_vllm=true (generation=vllm_colocate / vllm_server) needs a CUDA GPU and the vllm "
            "package (pip install vllm); use generation=transformers on this machine"
        )


def grpo_config(
    trainer_cfg: DictConfig,
    output_dir: Path,
    report_to: str,
    reward_weights: list[float],
    bf16: bool,
    processes: int = 1,
):
    """GRPOConfig: every trainer.* knob under its own name, batch sizes derived, our logging conventions."""
    knobs = OmegaConf.to_container(trainer_cfg, enum_to_str=True)
    extra = knobs.pop("extra")
    for key in OWN_KEYS:
        knobs.pop(key, None)
    if not knobs["save_steps"]:
        knobs.pop("save_steps")
    # prompts_per_step is per optimisation step over all processes, so adding processes keeps the experiment.
    completions_per_process = trainer_cfg.prompts_per_step * trainer_cfg.num_generations // processes
    ours = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": completions_per_process,
        "gradient_accumulation_steps": 1,
        "reward_weights": reward_weights,
        "report_to": report_to,
        "save_strategy": "steps" if trainer_cfg.save_steps else "no",
        "disable_tqdm": False,
        "bf16": bf16,  # mixed precision only for a bfloat16 model (TRL's default assumes a GPU)
        "use_cpu": not torch.cuda.is_available(),  # on CPU, accelerate's multi-process mode needs it (gloo)
    }
    try:
        return GRPOConfig(**(ours | knobs | extra))
    except (TypeError, ValueError) as err:  # GRPOConfig's own checks (a pass-through value of the wrong kind)
        raise UserError(f"trainer: {err}") from err
