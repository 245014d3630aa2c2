"""Config -> GRPOExpConfig: TRL's GRPOConfig with grpo_exp's own trainer knobs, batch sizes derived so that any
group size is valid; and every rule on the trainer.* knobs, checked before any model loads."""

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import parse_flag_from_env
from omegaconf import DictConfig, OmegaConf
from trl import GRPOConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.schema import MismatchCorrection, TrainerSchema, ZeroVarianceGroups
from grpo_exp.trainer.advantages import TRL_ADVANTAGES, algorithm_settings
from grpo_exp.trainer.losses import check_loss, is_trls, trl_loss_type
from grpo_exp.trainer.mismatch import check_mismatch, vllm_fields
from grpo_exp.trainer.sampling import (
    check_fast_generation_device,
    check_generation_path,
    check_sampling,
    runs_sharded,
    training_device,
)
from grpo_exp.trainer.vllm_engine import check_seeded_sampling, check_vllm_installed, check_vllm_sampling
from grpo_exp.trainer.zero_variance import check_zero_variance_groups

# grpo_exp's own trainer knobs, read by the trainer from its `args` as TRL reads its own: declared once, in
# grpo_exp.schema.TrainerSchema (type, default, meaning; marked knob(..., trainer_arg=True)), and taken from there as
# GRPOExpConfig fields.
OWN_KNOBS = tuple(f.name for f in dataclasses.fields(TrainerSchema) if f.metadata.get("trainer_arg"))


def _own_knob_fields() -> list[tuple]:
    types, schema = typing.get_type_hints(TrainerSchema), {f.name: f for f in dataclasses.fields(TrainerSchema)}
    meaning = {"help": "grpo_exp's trainer.{} (its meaning: grpo_exp.schema.TrainerSchema)"}
    return [
        (name, types[name], field(default=schema[name].default, metadata={"help": meaning["help"].format(name)}))
        for name in OWN_KNOBS
    ]


OwnKnobs = dataclasses.make_dataclass("OwnKnobs", _own_knob_fields())


@dataclass
class GRPOExpConfig(GRPOConfig, OwnKnobs):
    """TRL's GRPOConfig plus grpo_exp's own trainer knobs (OWN_KNOBS), which the trainer reads from its `args` as TRL
    reads its own, and the advantage estimator and policy loss of the run."""

    # The `algorithm` config group (grpo_exp.trainer.advantages): the estimator and its settings (keyword arguments).
    advantage_estimator: str = field(
        default=TRL_ADVANTAGES,
        metadata={"help": "How rewards become advantages: a registered estimator (grpo_exp.trainer.advantages)."},
    )
    advantage_settings: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "The estimator's settings, passed to it as keyword arguments."}
    )
    # trainer.loss_type when it is not one of TRL's (grpo_exp.trainer.losses): TRL's loss_type is then dapo's.
    policy_loss: str | None = field(
        default=None,
        metadata={"help": "A per-token policy loss of grpo_exp's or the user's (module:name) in place of TRL's."},
    )
    # rollout.turn_credit / rollout.discount of a multi-turn run (grpo_exp.rollout.flow): how its turns are credited.
    turn_credit: str = field(
        default="outcome",
        metadata={"help": "outcome (every turn the trajectory's advantage) or discounted_return (each turn its own)."},
    )
    turn_discount: float = field(default=1.0, metadata={"help": "The discount of rollout.turn_credit's returns."})

    @property
    def device(self) -> torch.device:
        """TrainingArguments' device, a CPU one without an index: transformers 5.17 resumes several CPU processes by
        loading the optimizer's state onto args.device, and torch cannot place tensors on "cpu:0"."""
        device = super().device
        return torch.device("cpu") if device.type == "cpu" else device

    def __post_init__(self):
        super().__post_init__()
        # A str from the config or a saved JSON (to_dict writes the value), as TrainingArguments reads its own enums.
        self.zero_variance_groups = ZeroVarianceGroups(self.zero_variance_groups)
        if self.mismatch_correction is not None:
            self.mismatch_correction = MismatchCorrection(self.mismatch_correction)
        check_generation_path(
            self.bfloat16_generation, self.fast_generation, self.use_vllm, self.use_transformers_paged
        )
        device = training_device(self.use_cpu)
        check_fast_generation_device(self.fast_generation, device, runs_sharded(self.deepspeed, self.fsdp))


# TrainerSchema keys of the run, not the trainer's: no GRPOExpConfig field takes them (trainer.extra holds fields).
RUN_KEYS = {"prompts_per_step", "keep_checkpoints", "resume", "return_freed_memory"}


def check_fsdp_device(fsdp: bool) -> None:
    """accelerate turns FSDP on for GPU processes only: on CPU processes (gloo) it keeps its plugin and trains them
    as DDP, unsharded, with no word (accelerate.state.AcceleratorState lists the GPU kinds that get FSDP)."""
    if fsdp and not torch.cuda.is_available():
        raise UserError(
            "FSDP (accelerate_configs/fsdp.yaml) needs GPUs: accelerate runs CPU processes as plain DDP whatever the "
            "config says. On this machine use accelerate_configs/ddp.yaml, or DeepSpeed ZeRO "
            "(accelerate_configs/zero3.yaml --mixed_precision no), which shards CPU processes too"
        )


def check_trainer(trainer_cfg: DictConfig, processes: int, *, multiturn: bool, policy_dtype: torch.dtype) -> None:
    """Every rule on the trainer.* knobs, before any model loads: the checks GRPOConfig would make later, naming
    our keys, and grpo_exp's own (the schema's value checks, grpo_exp.schema.check_values, come first).
    `multiturn`: rollout=multiturn; `policy_dtype`: the dtype the policy will load in."""
    if (trainer_cfg.prompts_per_step * trainer_cfg.num_generations) % processes:
        raise UserError(
            f"trainer.prompts_per_step * trainer.num_generations = "
            f"{trainer_cfg.prompts_per_step * trainer_cfg.num_generations} completions per step cannot be split "
            f"evenly over {processes} processes: change trainer.prompts_per_step"
        )
    extra = trainer_cfg.extra
    check_sampling(
        trainer_cfg.bfloat16_generation,
        trainer_cfg.fast_generation,
        use_vllm=bool(extra.get("use_vllm")),
        use_transformers_paged=bool(extra.get("use_transformers_paged")),
        multiturn=multiturn,
        device=training_device(bool(extra.get("use_cpu"))),
        sharded=runs_sharded(extra.get("deepspeed"), extra.get("fsdp")),
        policy_dtype=policy_dtype,
    )
    check_mismatch(
        trainer_cfg,
        use_vllm=bool(extra.get("use_vllm")),
        use_transformers_paged=bool(extra.get("use_transformers_paged")),
        sharded=runs_sharded(extra.get("deepspeed"), extra.get("fsdp")),
        loss_type=str(trainer_cfg.loss_type),
    )
    if extra.get("use_vllm"):
        check_vllm_sampling(trainer_cfg)
        check_seeded_sampling(trainer_cfg)
        check_vllm_installed()
    check_fsdp_device(fsdp=bool(parse_flag_from_env("ACCELERATE_USE_FSDP") or extra.get("fsdp")))
    check_zero_variance_groups(trainer_cfg.zero_variance_groups, processes)
    check_loss(trainer_cfg)
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    for key, value in extra.items():
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


def ddp_timeout(trainer_cfg: DictConfig) -> timedelta:
    """How long a process waits in a collective (+trainer.extra.ddp_timeout, GRPOConfig's field, in seconds; else
    its default). Read before the checks, which report a value of the wrong type: this one falls back meanwhile."""
    value = trainer_cfg.extra.get("ddp_timeout")
    valid = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return timedelta(seconds=value if valid else GRPOConfig.__dataclass_fields__["ddp_timeout"].default)


def grpo_exp_config(
    trainer_cfg: DictConfig,
    output_dir: Path,
    report_to: str,
    reward_weights: list[float],
    bf16: bool,
    processes: int = 1,
    algorithm: DictConfig | None = None,
    rollout: DictConfig | None = None,
    native_tool_calling: bool = False,
) -> GRPOExpConfig:
    """GRPOExpConfig: every trainer.* knob under its own name, batch sizes derived, our logging conventions; the
    advantage estimator, `algorithm` (None: grpo, TRL's own); a multi-turn `rollout`'s credit of its turns, and its
    turns as TRL's tool rounds where TRL's tool-calling loop runs its environments (`native_tool_calling`)."""
    knobs = OmegaConf.to_container(trainer_cfg, enum_to_str=True)
    extra = knobs.pop("extra")
    for key in RUN_KEYS:
        knobs.pop(key, None)
    if not knobs["save_steps"]:
        knobs.pop("save_steps")
    loss = knobs["loss_type"]
    knobs |= {"loss_type": trl_loss_type(loss), "policy_loss": None if is_trls(loss) else loss}
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
    if extra.get("use_vllm"):  # the correction asked (mismatch.asked_correction) is TRL's own with vLLM
        ours |= vllm_fields(trainer_cfg)
    if algorithm is not None:
        ours |= {"advantage_estimator": algorithm.name, "advantage_settings": algorithm_settings(algorithm)}
    if rollout is not None:
        ours |= {
            "turn_credit": getattr(rollout.turn_credit, "value", rollout.turn_credit),
            "turn_discount": rollout.discount,
        }
    if native_tool_calling:  # TRL's tool rounds: each turn's call runs and the policy reads its result
        ours["max_tool_calling_iterations"] = rollout.max_turns
    try:
        return GRPOExpConfig(**(ours | knobs | extra))
    except (TypeError, ValueError) as err:  # GRPOConfig's own checks (a pass-through value of the wrong kind)
        raise UserError(f"trainer: {err}") from err


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("trainer.warmup_steps",),
        lambda cfg: cfg.trainer.lr_scheduler_type != "constant",
        "by a learning-rate schedule with a warm-up",
        lambda cfg: "trainer.lr_scheduler_type=constant has none",
        "set trainer.lr_scheduler_type=constant_with_warmup (or linear, cosine...)",
    ),
)
