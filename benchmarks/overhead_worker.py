"""One timed training run for `benchmarks.overhead`, in its own process (so that peak memory is its own).

    python -m benchmarks.overhead_worker grpo_exp|trl STEPS OUT.json [overrides...]

`grpo_exp`: the real `python -m grpo_exp.train` job (group statistics, W&B offline logging, metrics file),
in-process, with timers wrapped around the parts whose share of a step we report. `trl`: the same
experiment as a bare TRL script: the same model, data, reward functions and weights, seed, group size,
completion length and learning rate, straight into GRPOTrainer, no logging.
"""

import functools
import json
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SECONDS: dict[str, float] = defaultdict(float)
# The wrapper's own cost: grpo_exp doing TRL's work (every group trained, TRL's forward), not its faster settings.
KEEP_TRLS_WORK = [
    "trainer.zero_variance_groups=keep",
    "trainer.shared_prompt_forward=false",
    "trainer.fast_generation=false",
]


def timed(owner, name: str, bucket: str) -> None:
    """Wrap owner.name so that its wall time adds to SECONDS[bucket]; behaviour unchanged."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[bucket] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def run_grpo_exp(steps: int, out_dir: Path, overrides: list[str]) -> dict:
    from transformers.integrations import WandbCallback
    from trl import GRPOTrainer

    from grpo_exp import train
    from grpo_exp.run.tracking import MetricsFileCallback, read_metrics
    from grpo_exp.trainer.trainer import GRPOExpTrainer
    from grpo_exp.verification.p_yes import PYesScorer

    timed(GRPOTrainer, "_calculate_rewards", "rewards")
    timed(GRPOExpTrainer, "_record_group_statistics", "group statistics (incl. their W&B histograms/tables)")
    timed(GRPOExpTrainer, "_log_groups", "of which W&B histograms/tables")
    timed(PYesScorer, "__call__", "verification heads (P(Yes))")
    timed(WandbCallback, "on_log", "logging: W&B per step")
    timed(MetricsFileCallback, "on_log", "logging: metrics.jsonl")
    sys.argv = [
        "grpo_exp.train",
        *KEEP_TRLS_WORK,
        *overrides,
        f"trainer.max_steps={steps}",
        "eval.before=false",
        "eval.after=false",
        "save_model=false",
        "trainer.save_steps=0",
        f"hydra.run.dir={out_dir}",
    ]
    train.main()
    metrics = read_metrics(out_dir / "metrics.jsonl")
    return {
        "step_times": [m["step_time"] for m in metrics if "step_time" in m],
        "train_runtime": next(m["train_runtime"] for m in metrics if "train_runtime" in m),
        "parts": dict(SECONDS),
    }


def bare_trl_trainer(steps: int, out_dir: Path, overrides: list[str]):
    """The experiment that `overrides` compose, as a bare TRL GRPOTrainer (not trained yet), with its run spec: the same
    model, data, rewards and settings (any GRPOConfig field the run passes through, trainer.extra; LoRA), on the GPU
    where there is one, GRPOConfig's own defaults otherwise."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from grpo_exp.data import load_splits
    from grpo_exp.models import lora_config, torch_dtype
    from grpo_exp.rewards.registry import build_rewards
    from grpo_exp.run.setup import load_policy
    from grpo_exp.verification.labels import built_in_labels
    from support.config import resolved_config

    spec = resolved_config(overrides)  # only to read the same values the grpo_exp run uses
    cfg, t = spec.cfg, spec.cfg.trainer
    train_set, _ = load_splits(cfg.dataset)
    tokenizer, model = load_policy(spec, spec.policy_dtype)
    reward_funcs, reward_weights = build_rewards(spec.components, {"verifier": built_in_labels()}), spec.reward_weights
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=t.prompts_per_step * t.num_generations,
        num_generations=t.num_generations,
        max_completion_length=t.max_completion_length,
        max_steps=steps,
        learning_rate=t.learning_rate,
        beta=t.beta,
        loss_type=t.loss_type,
        temperature=t.temperature,
        lr_scheduler_type=t.lr_scheduler_type,
        seed=t.seed,
        reward_weights=reward_weights,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=torch_dtype(cfg.model.dtype) == torch.bfloat16,
        use_cpu=not torch.cuda.is_available(),
        **dict(t.extra),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train_set,
        processing_class=tokenizer,
        peft_config=lora_config(cfg.model),
    )
    return trainer, spec


def run_bare_trl(steps: int, out_dir: Path, overrides: list[str]) -> dict:
    trainer, _ = bare_trl_trainer(steps, out_dir, overrides)
    output = trainer.train()
    history = trainer.state.log_history
    return {
        "step_times": [h["step_time"] for h in history if "step_time" in h],
        "train_runtime": output.metrics["train_runtime"],
        "parts": {},
    }


def main() -> None:
    variant, steps, out_file, *overrides = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        runner = run_grpo_exp if variant == "grpo_exp" else run_bare_trl
        result = runner(int(steps), Path(tmp) / "run", overrides)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(out_file).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
