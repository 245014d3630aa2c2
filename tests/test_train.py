"""End to end through the command line: TRL's GRPOTrainer really trains (tiny model; the embedded one in `slow`)."""

import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from grpo_exp.models import load_model, load_tokenizer
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import NO_SAVED_WEIGHTS, run_cli

# ---- the shared tiny run (tests/conftest.py's tiny_cli_run: TINY_CLI_RUN through the command line) ------------


@pytest.mark.e2e
def test_tiny_training_runs_its_steps_and_evaluates_before_and_after(tiny_cli_run):
    summary = json.loads((tiny_cli_run.run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["heldout_accuracy_before"] is not None and summary["heldout_accuracy_after"] is not None
    steps = [m for m in read_metrics(tiny_cli_run.run_dir / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 2
    assert all("rewards/length/mean" in m and "rewards/math/mean" in m for m in steps)
    assert any(m["grad_norm"] > 0 for m in steps)
    assert (tiny_cli_run.run_dir / "train.log").is_file()


@pytest.mark.e2e
def test_tiny_training_updates_the_weights(tiny_cli_run, tiny_model_dir):
    trained = AutoModelForCausalLM.from_pretrained(tiny_cli_run.run_dir / "checkpoint-final")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    changed = [name for name, p in trained.state_dict().items() if not torch.equal(p, initial[name])]
    assert changed, "GRPO did not change any weight"


@pytest.mark.e2e
def test_tiny_training_saves_the_resolved_config(tiny_cli_run):
    saved = yaml.safe_load((tiny_cli_run.run_dir / "config.yaml").read_text())
    assert list(saved["reward"]["components"]) == ["math", "format", "length"]
    assert saved["trainer"]["num_generations"] == 2


@pytest.mark.e2e
def test_tiny_training_without_a_wandb_key_logs_an_offline_run_and_prints_its_sync_command(tiny_cli_run):
    assert list((tiny_cli_run.run_dir / "wandb").glob("offline-run-*"))
    assert "wandb sync" in tiny_cli_run.result.stdout


@pytest.mark.e2e
def test_multirun_over_reward_mixes_runs_every_job_as_one_wandb_group(tmp_path):
    result = run_cli(
        "-m",
        *TINY_RUN,
        "logger=wandb",
        "eval.before=false",
        "eval.after=false",
        "trainer.max_steps=1",  # what is checked is each job's config and W&B identity, not its training
        "reward=math+length,format+length",
        "trainer.num_generations=2,3",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if (p / "summary.json").exists())
    assert len(jobs) == 4
    seen = set()
    for job in jobs:
        saved = yaml.safe_load((job / "config.yaml").read_text())
        seen.add(("+".join(saved["reward"]["components"]), saved["trainer"]["num_generations"]))
        summary = json.loads((job / "summary.json").read_text())
        assert summary["num_generations"] == saved["trainer"]["num_generations"]
        # W&B: named by what the sweep varies only, one group for the sweep, job type train
        mix = "+".join(saved["reward"]["components"])
        assert summary["wandb_name"] == f"reward={mix},trainer.num_generations={saved['trainer']['num_generations']}"
        assert summary["wandb_group"] == tmp_path.as_posix()[-128:] and summary["wandb_job_type"] == "train"
    assert seen == {(m, g) for m in ("math+length", "format+length") for g in (2, 3)}


@pytest.mark.e2e
def test_a_local_pretrained_directory_trains_with_lora(tmp_path, tiny_model_dirs):
    """The generic loader on a real directory (what a hub download gives), with peft LoRA adapters."""
    model_dir = tiny_model_dirs(seed=0)  # with its tokenizer, as a hub download is
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY_RUN,
        "model=pretrained",
        f"model.name_or_path={model_dir}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "reward=math+length",
        "logger=none",
        "eval.before=false",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "checkpoint-final" / "adapter_config.json").is_file()
    assert "LoRA" in json.loads((run_dir / "summary.json").read_text())["model"]


@pytest.mark.slow
def test_embedded_model_with_the_self_verification_task(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        "reward=math+format+selfverify",
        "trainer.max_steps=1",
        # 24 tokens: SmolLM2's greedy answers to arith are shorter (`5 - 9 = 2`), and sampled ones still end in an
        # answer often enough to verify (4 of 4 examples); the policy's own answers, sampled to this length twice
        # (before, after), were half of the test's time at 48
        "trainer.max_completion_length=24",
        "trainer.prompts_per_step=3",
        "trainer.num_generations=2",  # the step only has to train: the held-out measures are what is checked
        "dataset.eval_size=4",
        "logger=none",
        *NO_SAVED_WEIGHTS,
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # held-out self-verification measured before and after (SmolLM2 writes extractable answers)
    for when in ("before", "after"):
        assert 0.0 <= summary[f"heldout_verify_accuracy_{when}"] <= 1.0
        assert summary[f"heldout_verify_examples_{when}"] > 0
    assert "self-verification" in result.stdout


@pytest.mark.e2e
def test_a_bfloat16_policy_keeps_float32_master_weights_that_updates_below_bfloat16_precision_move(tmp_path):
    """model.dtype=bfloat16 computes in bfloat16 (autocast) on float32 weights: at lr 1e-6 each AdamW update is
    ~1e-6, far below bfloat16's precision at these weights' size, so 16-bit weights would not move at all."""
    overrides = [*TINY_RUN, "model.dtype=bfloat16", "trainer.learning_rate=1e-6", "reward=math+format+length"]
    result = run_cli(*overrides, "trainer.zero_variance_groups=keep", "logger=none", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(m["grad_norm"] > 0 for m in read_metrics(tmp_path / "metrics.jsonl") if "grad_norm" in m)
    cfg = compose_config(overrides)
    start = load_model(cfg.model, load_tokenizer(cfg.model, cfg.cache_dir), cfg.cache_dir, cfg.trainer.seed)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-final")
    name = "model.layers.0.mlp.down_proj.weight"
    before, after = start.get_parameter(name), trained.get_parameter(name)
    assert before.dtype == torch.bfloat16 and after.dtype == torch.float32
    assert (after != before.float()).float().mean() > 0.5, "the updates moved the float32 weights"
    assert (after.to(torch.bfloat16) == before).float().mean() > 0.9, "in bfloat16 they would have rounded away"
