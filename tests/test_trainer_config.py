"""GRPOExpConfig: grpo_exp's trainer knobs on TRL's GRPOConfig, their defaults the schema's, their rules checked from
plain values (before any model loads) and again where the config is built."""

import json
from pathlib import Path

import pytest

from grpo_exp.errors import UserError
from grpo_exp.schema import TrainerSchema, ZeroVarianceGroups
from grpo_exp.trainer.config import OWN_KNOBS, GRPOExpConfig, grpo_exp_config
from grpo_exp.trainer.sampling import check_fast_generation_device, runs_sharded

KNOBS = OWN_KNOBS  # each of grpo_exp's own knobs, every one of them


def test_its_defaults_are_the_schemas_and_the_config_sets_them(cfg_train):
    args = GRPOExpConfig(output_dir="unused", use_cpu=True)
    assert {k: getattr(args, k) for k in KNOBS} == {k: getattr(TrainerSchema(), k) for k in KNOBS}
    cfg_train.trainer.zero_variance_groups, cfg_train.trainer.max_resample_batches = "resample", 2
    built = grpo_exp_config(cfg_train.trainer, Path("unused"), "none", [1.0], False)
    assert built.zero_variance_groups is ZeroVarianceGroups.resample and built.max_resample_batches == 2


def test_the_zero_variance_mode_is_the_schemas_enum_and_serialises_as_its_value():
    args = GRPOExpConfig(output_dir="unused", use_cpu=True, zero_variance_groups="keep")  # as a saved JSON gives it
    assert args.zero_variance_groups is ZeroVarianceGroups.keep
    assert json.loads(args.to_json_string())["zero_variance_groups"] == "keep"  # what trackers receive
    with pytest.raises(ValueError, match="'drop' is not a valid ZeroVarianceGroups"):
        GRPOExpConfig(output_dir="unused", use_cpu=True, zero_variance_groups="drop")


def test_its_own_checks_run_where_it_is_built():
    with pytest.raises(UserError, match="use_transformers_paged=true: continuous batching samples instead"):
        GRPOExpConfig(output_dir="unused", use_cpu=True, bfloat16_generation=True, use_transformers_paged=True)


def test_an_explicit_fast_generation_is_refused_on_a_gpu_or_sharded(monkeypatch):
    with pytest.raises(UserError, match="this run is on cuda. Use generation=transformers"):
        check_fast_generation_device(True, "cuda", sharded=False)
    with pytest.raises(UserError, match="this run is on cpu under DeepSpeed/FSDP"):
        check_fast_generation_device(True, "cpu", sharded=True)
    check_fast_generation_device(None, "cuda", sharded=True)  # auto: never refused, it turns itself off
    for launch in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(launch, raising=False)
    assert not runs_sharded() and runs_sharded(fsdp="full_shard")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # as `accelerate launch` sets it for an FSDP config
    assert runs_sharded()
