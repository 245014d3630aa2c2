"""One training job: check the config, build the objects, evaluate, train with GRPOTrainer, summarise."""

import json
import logging
import time
import warnings
from pathlib import Path

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from transformers import set_seed

from grpo_exp.build import check_trainer, grpo_config
from grpo_exp.data import check_data_files, load_splits
from grpo_exp.errors import UserError
from grpo_exp.evaluate import EvalResult, heldout_accuracy, self_verification_metrics
from grpo_exp.models import check_reachable, describe, load_model, load_tokenizer, lora_config, torch_dtype
from grpo_exp.report import build_summary, print_summary, write_summary
from grpo_exp.rewards.registry import build_rewards
from grpo_exp.schema import VerifierName, VerifierSchema
from grpo_exp.tracking import METRICS_FILE, MetricsFileCallback, Tracker, redact, report_to, run_identity
from grpo_exp.trainer import GRPOExpTrainer
from grpo_exp.verification import PYesScorer, Verifier, build_p_yes, math_verify_verifier

log = logging.getLogger("grpo_exp.train")


def check_and_build(cfg: DictConfig):
    """Everything in the config that can be wrong fails here, before any model loads.

    Returns the reward functions, their weights and the verifier (all cheap to build).
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"required value(s) not set: {', '.join(missing)} (add e.g. {missing[0]}=...)")
    reward_funcs, reward_weights = build_rewards(cfg.reward)
    verifier = math_verify_verifier()
    check_trainer(cfg.trainer)
    task = cfg.reward.components.get("selfverify")
    if task is not None and task.schedule == "joint" and cfg.trainer.prompts_per_step < 2:
        raise UserError(
            "reward.components.selfverify.schedule=joint mixes verification groups into batches of several "
            f"prompts, but trainer.prompts_per_step={cfg.trainer.prompts_per_step}: raise it or use schedule=interleave"
        )
    check_data_files(cfg.dataset)
    check_reachable(cfg.model)
    return reward_funcs, reward_weights, verifier


def evaluate(model, tokenizer, heldout: Dataset, verifier: Verifier, cfg: DictConfig, run_dir: Path, when: str):
    """Greedy held-out accuracy; every problem's completion and label go to eval_<when>.jsonl."""
    max_new_tokens = cfg.eval.max_new_tokens or cfg.trainer.max_completion_length
    result = heldout_accuracy(
        model, tokenizer, heldout, verifier, max_new_tokens, cfg.eval.batch_size, f"held-out eval ({when})"
    )
    log.info("Held-out accuracy %s training: %.3f (%d/%d)", when, result.accuracy, result.correct, result.scored)
    task_cfg = cfg.reward.components.get("selfverify")
    if task_cfg is not None:
        result.verification = self_verification_metrics(
            model, tokenizer, heldout, verifier, task_cfg, max_new_tokens, cfg.eval.batch_size, cfg.trainer.seed
        )
        log.info("Held-out self-verification %s training: %s", when, result.verification)
    with (run_dir / f"eval_{when}.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(sample) + "\n" for sample in result.samples)
    return result


def run_experiment(cfg: DictConfig, hydra_cfg: DictConfig) -> dict:
    # Deprecation notices from inside transformers/TRL are not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    reward_funcs, reward_weights, verifier = check_and_build(cfg)
    bf16 = torch_dtype(cfg.model.dtype) == torch.bfloat16
    args = grpo_config(cfg.trainer, run_dir / "trainer", report_to(cfg.logger), reward_weights, bf16)

    resolved = redact(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved), encoding="utf-8")
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra") and v}
    name, group = run_identity(hydra_cfg)

    set_seed(cfg.trainer.seed)
    train_set, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed)

    tags = [f"{k}:{v}" for k, v in choices.items()]
    tracker = Tracker(cfg.logger, run_dir, name, group, tags, {**resolved, "choices": choices})
    failed = True
    try:
        before = evaluate(model, tokenizer, heldout, verifier, cfg, run_dir, "before") if cfg.eval.before else None
        trainer = GRPOExpTrainer(
            verifier=verifier,
            stats_cfg=cfg.stats,
            samples_path=run_dir / "samples.jsonl",
            selfverify_cfg=cfg.reward.components.get("selfverify"),
            p_yes=p_yes_scorer(cfg),
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_set,
            processing_class=tokenizer,
            callbacks=[MetricsFileCallback(run_dir / METRICS_FILE)],
            peft_config=lora_config(cfg.model),
        )
        bind_policy([*reward_funcs, trainer], trainer.model, tokenizer)
        started = time.perf_counter()
        try:
            trainer.train()
        except BaseException:
            _save_quietly(trainer, run_dir / "checkpoint-interrupted")
            raise
        train_seconds = time.perf_counter() - started
        after = evaluate(trainer.model, tokenizer, heldout, verifier, cfg, run_dir, "after") if cfg.eval.after else None
        checkpoint = run_dir / "checkpoint-final" if cfg.save_model else None
        if checkpoint:
            trainer.save_model(str(checkpoint))
        summary = (
            build_summary(
                cfg,
                name=name,
                model=describe(cfg.model, trainer.model),
                sizes=(len(train_set), len(heldout)),
                steps=trainer.state.global_step,
                train_seconds=train_seconds,
                accuracy=(_accuracy(before), _accuracy(after)),
                paths={
                    "run_dir": run_dir,
                    "config": run_dir / "config.yaml",
                    "metrics": run_dir / METRICS_FILE,
                    "log": run_dir / f"{hydra_cfg.job.name}.log",
                    "checkpoint": checkpoint,
                    "wandb": tracker.run_path,
                },
                wandb_sync=tracker.sync_command(),
            )
            | tracker.identity()
        )
        for when, result in (("before", before), ("after", after)):
            if result is not None:
                summary |= {f"heldout_{k.replace('/', '_')}_{when}": v for k, v in result.verification.items()}
        write_summary(summary, run_dir / "summary.json")
        tracker.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
        failed = False
    finally:
        tracker.finish(failed)
    print_summary(summary)
    return summary


def p_yes_scorer(cfg: DictConfig) -> PYesScorer | None:
    """The P(Yes) scorer behind the self-verification metrics: the configured generative verifier, or the
    policy itself when the verifier is rule-based. None when the task is off."""
    if "selfverify" not in cfg.reward.components:
        return None
    scorer = build_p_yes(cfg.verifier, cfg.model, cfg.cache_dir)
    if scorer is None:
        policy_verifier = OmegaConf.structured(VerifierSchema(name=VerifierName.self))
        scorer = PYesScorer(policy_verifier, cfg.model, cfg.cache_dir)
    return scorer


def bind_policy(holders: list, model, tokenizer) -> None:
    """Point every P(Yes) scorer that follows the policy (verifier=self) at the live, trained weights."""
    for holder in holders:
        scorer = getattr(holder, "scorer", None) or getattr(holder, "p_yes", None)
        if scorer is not None and scorer.follows_policy:
            scorer.bind(model, tokenizer)


def _accuracy(result: EvalResult | None) -> float | None:
    return result.accuracy if result else None


def _save_quietly(trainer, path: Path) -> None:
    """Keep the weights of an interrupted run; never let this mask the original error."""
    try:
        trainer.save_model(str(path))
        log.warning("Training stopped early; weights so far saved to %s", path)
    except Exception as err:  # noqa: BLE001
        log.warning("Could not save the interrupted run's weights: %s", err)
