"""`python -m grpo_exp.train`: compose the config, train with TRL's GRPOTrainer, evaluate, summarise.

Heavy libraries are imported inside `train` so that `--help` and `--cfg job` stay fast.
"""

import json
import logging
import time
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.schema import register_schemas

register_schemas()
log = logging.getLogger("grpo_exp.train")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the held-out accuracy after training (the objective of Hydra sweepers such as Optuna)."""
    return train(cfg)["heldout_accuracy_after"]


def train(cfg: DictConfig) -> dict:
    import torch
    from transformers import set_seed
    from trl import GRPOTrainer

    from grpo_exp.build import check_trainer, grpo_config
    from grpo_exp.data import check_data_files, load_splits
    from grpo_exp.models import (
        check_reachable,
        describe,
        load_model,
        load_tokenizer,
        lora_config,
        torch_dtype,
    )
    from grpo_exp.report import print_summary, reward_trend, write_summary
    from grpo_exp.rewards import build_rewards
    from grpo_exp.tracking import (
        METRICS_FILE,
        MetricsFileCallback,
        Tracker,
        read_metrics,
        redact,
        report_to,
        run_name,
    )
    from grpo_exp.verification import build_verifier

    # Deprecation notices from inside transformers/TRL are not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # Everything that can be wrong in the config fails here, before any model loads.
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"required value(s) not set: {', '.join(missing)} (add e.g. {missing[0]}=...)")
    reward_funcs, reward_weights = build_rewards(cfg.reward)
    verifier = build_verifier(cfg.verifier.name)
    check_trainer(cfg.trainer)
    args = grpo_config(
        cfg.trainer,
        run_dir / "trainer",
        report_to(cfg.logger),
        reward_weights,
        bf16=torch_dtype(cfg.model.dtype) == torch.bfloat16,
    )
    check_data_files(cfg.dataset)
    check_reachable(cfg.model)

    resolved = redact(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved), encoding="utf-8")
    name = run_name(list(hydra_cfg.overrides.task))
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra") and v}
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    group = str(Path(hydra_cfg.sweep.dir)) if multirun else None

    set_seed(cfg.trainer.seed)
    train_set, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed)
    eval_tokens = cfg.eval.max_new_tokens or cfg.trainer.max_completion_length

    def evaluate(policy, when: str):
        from grpo_exp.evaluate import heldout_accuracy

        result = heldout_accuracy(
            policy, tokenizer, heldout, verifier, eval_tokens, cfg.eval.batch_size, f"held-out eval ({when})"
        )
        log.info(
            "Held-out accuracy %s training: %.3f (%d/%d)",
            when,
            result.accuracy,
            result.correct,
            result.scored,
        )
        with (run_dir / f"eval_{when}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in result.samples)
        return result

    tracker = Tracker(
        cfg.logger,
        run_dir,
        name,
        group,
        [f"{k}:{v}" for k, v in choices.items()],
        {**resolved, "choices": choices},
    )
    failed = True
    try:
        before = evaluate(model, "before") if cfg.eval.before else None
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_set,
            processing_class=tokenizer,
            callbacks=[MetricsFileCallback(run_dir / METRICS_FILE)],
            peft_config=lora_config(cfg.model),
        )
        started = time.perf_counter()
        try:
            trainer.train()
        except BaseException:
            _save_quietly(trainer, run_dir / "checkpoint-interrupted")
            raise
        train_seconds = time.perf_counter() - started
        after = evaluate(trainer.model, "after") if cfg.eval.after else None
        checkpoint = None
        if cfg.save_model:
            checkpoint = run_dir / "checkpoint-final"
            trainer.save_model(str(checkpoint))
        reward_first, reward_last = reward_trend(read_metrics(run_dir / METRICS_FILE))
        steps = trainer.state.global_step
        summary = {
            "name": name,
            "model": describe(cfg.model, trainer.model),
            "dataset": cfg.dataset.name,
            "train_size": len(train_set),
            "eval_size": len(heldout),
            "reward": " + ".join(f"{w:g}*{n}" for n, w in zip(cfg.reward.components, reward_weights, strict=True)),
            "steps": steps,
            "prompts_per_step": cfg.trainer.prompts_per_step,
            "num_generations": cfg.trainer.num_generations,
            "beta": cfg.trainer.beta,
            "learning_rate": cfg.trainer.learning_rate,
            "train_seconds": train_seconds,
            "seconds_per_step": train_seconds / max(steps, 1),
            "reward_first": reward_first,
            "reward_last": reward_last,
            "heldout_accuracy_before": before.accuracy if before else None,
            "heldout_accuracy_after": after.accuracy if after else None,
            "run_dir": run_dir,
            "config": run_dir / "config.yaml",
            "metrics": run_dir / METRICS_FILE,
            "log": run_dir / f"{hydra_cfg.job.name}.log",
            "checkpoint": checkpoint,
            "wandb": tracker.run_path,
            "wandb_sync": tracker.sync_command(),
        }
        write_summary(summary, run_dir / "summary.json")
        tracker.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
        failed = False
    finally:
        tracker.finish(failed)
    print_summary(summary)
    return summary


def _save_quietly(trainer, path: Path) -> None:
    """Keep the weights of an interrupted run; never let this mask the original error."""
    try:
        trainer.save_model(str(path))
        log.warning("Training stopped early; weights so far saved to %s", path)
    except Exception as err:  # noqa: BLE001
        log.warning("Could not save the interrupted run's weights: %s", err)


if __name__ == "__main__":
    main()
