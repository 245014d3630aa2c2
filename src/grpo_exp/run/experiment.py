"""One training job: resolve the config (every check), build the objects, evaluate, train with GRPOTrainer,
summarise."""

import json
import logging
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from transformers import PrinterCallback, ProgressCallback, set_seed

from grpo_exp.data import load_splits
from grpo_exp.models import describe, load_model, load_tokenizer, lora_config
from grpo_exp.run.build import RunParts, build_parts
from grpo_exp.run.console import ConsoleView
from grpo_exp.run.distributed import is_main_process, shared_run_dir, world_size
from grpo_exp.run.files import (
    CONFIG_FILE,
    FINAL_CHECKPOINT_DIR,
    METRICS_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    TRAINER_DIR,
    eval_file,
)
from grpo_exp.run.heldout import (
    EvalResult,
    benchmark_statistics,
    judge_statistics,
    learned_components,
    run_heldout_accuracy,
    sampled_metrics,
    validation_metrics,
    verification_benchmark,
)
from grpo_exp.run.report import build_summary, print_summary, write_summary
from grpo_exp.run.resolve import RunSpec, resolve
from grpo_exp.run.resume import Attempt, carry_history, is_complete, remove_checkpoints, write_record
from grpo_exp.run.tracking import MetricsFileCallback, Tracker, run_identity
from grpo_exp.run.validation import BeforeTraining, PeriodicValidation, carry_best
from grpo_exp.run.wandb_offline import RECORD_KEY, segments_so_far, sync_command
from grpo_exp.trainer.config import ddp_timeout
from grpo_exp.trainer.seam import as_rollout_func, policy_for_generation
from grpo_exp.trainer.trainer import GRPOExpTrainer
from grpo_exp.verification.selfverify import Candidate

log = logging.getLogger("grpo_exp.train")


def measure_heldout(
    model,
    tokenizer,
    heldout: Dataset,
    parts: RunParts,
    spec: RunSpec,
    run_dir: Path,
    when: str,
    benchmark: list[Candidate] | None = None,
    answered: EvalResult | None = None,
):
    """Greedy held-out accuracy (with the tools, for rollout=multiturn); with self-verification or the judge on,
    their held-out measures too, and the verification benchmark when it is on. Every problem's completion and
    label go to eval_<when>.jsonl. Every process calls it: each answers a share of the problems (the main process
    alone asks the judge and writes). answered: the same model's greedy answers to all of `heldout`, already
    measured (a validation at the last step), taken instead of answering again."""
    cfg, max_new_tokens = spec.cfg, spec.eval_max_new_tokens
    result = answered or run_heldout_accuracy(model, tokenizer, heldout, spec, parts, f"held-out eval ({when})")
    log.info("Held-out accuracy %s training: %.3f (%d/%d)", when, result.accuracy, result.correct, result.scored)
    if result.rollout:
        log.info("Held-out trajectories %s training: %s", when, {k: round(v, 3) for k, v in result.rollout.items()})
    if parts.selfverify is not None:
        result.verification = parts.selfverify.heldout_metrics(
            model, tokenizer, heldout, max_new_tokens, cfg.eval.batch_size
        )
        log.info("Held-out self-verification %s training: %s", when, result.verification)
    if benchmark is not None:
        measured = benchmark_statistics(model, tokenizer, benchmark, spec)
        result.verification |= measured
        log.info("Verification benchmark %s training: %s", when, {k: round(v, 3) for k, v in measured.items()})
    if not is_main_process():  # the judge's requests and the files: once
        return result
    if parts.judge is not None:
        result.judge = judge_statistics(parts.judge, result.samples)
        log.info("Held-out judge %s training: %s", when, {k: round(v, 3) for k, v in result.judge.items()})
    with (run_dir / eval_file(when)).open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(sample) + "\n" for sample in result.samples)
    return result


def run_experiment(cfg: DictConfig, hydra_cfg: DictConfig) -> dict:
    # Deprecation notices from inside transformers/TRL are not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    run_dir = shared_run_dir(Path(hydra_cfg.runtime.output_dir), ddp_timeout(cfg.trainer))
    main = is_main_process()
    spec = resolve(cfg, trainer_dir=run_dir / TRAINER_DIR)
    parts = build_parts(spec)
    resolved, attempt = spec.saved_config, spec.attempt
    if main:
        (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved), encoding="utf-8")
        if attempt:
            carry_history(attempt, run_dir)
            carry_best(attempt.run_dir, run_dir, attempt.step)
    if attempt and attempt.finished:
        return report_finished(attempt, run_dir)
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra") and v}
    name, group = run_identity(hydra_cfg)

    set_seed(cfg.trainer.seed)
    train_set, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed, spec.policy_dtype)

    tags = [f"{k}:{v}" for k, v in choices.items()]
    run_id = attempt.record.get("wandb_id") if attempt else None
    tracker = Tracker(cfg.logger, run_dir, name, group, tags, {**resolved, "choices": choices}, run_id, enabled=main)
    # An offline W&B run continued here: every attempt's segment, oldest first (`wandb sync` needs them all).
    offline = tracker.run_path if tracker.mode == "offline" else None
    wandb_segments = segments_so_far(attempt, offline, run_id) if main else []
    console = ConsoleView()
    measured: dict = {"benchmark": None, "before": None, "seconds": 0.0}

    def before_training() -> None:
        """On the model where it trains (its device; every process evaluating a share)."""
        started = time.perf_counter()
        with policy_for_generation(trainer) as policy:
            if cfg.eval.verification_benchmark.enabled:  # from the initial policy, before any step
                measured["benchmark"] = verification_benchmark(
                    spec, policy, tokenizer, train_set, heldout, parts.verifier, run_dir
                )
            before = heldout_before(policy, tokenizer, heldout, parts, spec, run_dir, attempt, measured["benchmark"])
        measured["before"], console.heldout_before = before, _accuracy(before)
        if main:
            record = {"wandb_id": tracker.run_id, RECORD_KEY: wandb_segments}
            write_record(run_dir, record | {"heldout_before": before and asdict_light(before)})
        measured["seconds"] = time.perf_counter() - started  # not training time

    problems = heldout.select(range(min(cfg.eval.every_problems or len(heldout), len(heldout))))

    last_validation: dict = {}  # its step and greedy answers: the evaluation after training takes them when it can

    def validate() -> dict[str, float]:
        with policy_for_generation(trainer) as policy:
            result = run_heldout_accuracy(policy, tokenizer, problems, spec, parts, None)
            metrics = validation_metrics(result.samples, parts)
            last_validation.update(step=trainer.state.global_step, answers=result)
            if cfg.eval.every_samples:
                sampled = sampled_metrics(
                    policy,
                    tokenizer,
                    problems,
                    parts.verifier,
                    cfg.eval.every_samples,
                    cfg.eval.temperature,
                    spec.eval_max_new_tokens,
                    cfg.eval.batch_size,
                    parts.rollout,
                )
                metrics |= {f"heldout/{key}": value for key, value in sampled.items()}
        return metrics

    def initial() -> dict[str, float]:
        """The initial model's validation: the answers of the evaluation before training to these problems, when
        it ran (greedy: the same answers, up to the padding of a last, partial batch), scored as validations are."""
        before = measured["before"]
        if before is None or cfg.eval.every_samples:
            return validate()
        with policy_for_generation(trainer):  # verifier=self scores with the policy
            return validation_metrics(before.samples[: len(problems)], parts)

    validation = []
    if cfg.eval.every:
        validation.append(
            PeriodicValidation(
                cfg.eval.every,
                validate,
                record=lambda key, value: trainer.record_metric(key, value),
                log_now=lambda metrics: trainer.log(dict(metrics)),
                save_best=lambda directory: trainer.save_model(str(directory)),
                run_dir=run_dir,
                problems=len(problems),
                patience=cfg.eval.patience,
                stop_at=cfg.eval.stop_at,
                alarm=cfg.eval.alarm,
                learned=learned_components(parts),
                initial=initial,
                metric=cfg.eval.best_metric,
                keep_top_k=cfg.eval.keep_top_k,
            )
        )

    failed = True
    try:
        trainer = GRPOExpTrainer(
            verifier=parts.verifier,
            stats_cfg=cfg.stats,
            samples_path=run_dir / SAMPLES_FILE,
            selfverify=parts.selfverify,
            model=model,
            reward_funcs=parts.reward_funcs,
            args=spec.args,
            train_dataset=train_set,
            processing_class=tokenizer,
            callbacks=[
                BeforeTraining(before_training),
                *validation,
                MetricsFileCallback(run_dir / METRICS_FILE),
                console,
            ],
            peft_config=lora_config(cfg.model),
            rollout_func=None if parts.rollout is None else as_rollout_func(parts.rollout),
        )
        for dict_dump in (ProgressCallback, PrinterCallback):  # they print all 50+ metrics; ConsoleView shows a few
            trainer.remove_callback(dict_dump)
        parts.bind_policy(trainer.model, tokenizer)
        started = time.perf_counter()
        with interruptible(trainer):
            trainer.train(resume_from_checkpoint=str(attempt.checkpoint) if attempt else None)
        train_seconds = time.perf_counter() - started - measured["seconds"]
        before, after = measured["before"], None
        if cfg.eval.after:  # every process, on the model where it trained
            # a validation at the last step, on every held-out problem, has answered already
            validated = last_validation.get("step") == trainer.state.global_step and len(problems) == len(heldout)
            with policy_for_generation(trainer) as policy:
                after = measure_heldout(
                    policy,
                    tokenizer,
                    heldout,
                    parts,
                    spec,
                    run_dir,
                    "after",
                    measured["benchmark"],
                    answered=last_validation["answers"] if validated else None,
                )
        checkpoint = run_dir / FINAL_CHECKPOINT_DIR if cfg.save_model else None
        if checkpoint:
            trainer.save_model(str(checkpoint))  # every rank: DeepSpeed/FSDP gather their shards here
        if not cfg.trainer.keep_checkpoints and main:
            remove_checkpoints(run_dir)
        if not main:
            failed = False
            return {"heldout_accuracy_after": None}
        steps = trainer.state.global_step
        summary = (
            build_summary(
                cfg,
                name=name,
                model=describe(cfg.model, trainer.model),
                sizes=(len(train_set), len(heldout)),
                steps=steps,
                train_seconds=train_seconds,
                accuracy=(_accuracy(before), _accuracy(after)),
                paths={
                    "run_dir": run_dir,
                    "config": run_dir / CONFIG_FILE,
                    "metrics": run_dir / METRICS_FILE,
                    "log": run_dir / f"{hydra_cfg.job.name}.log",
                    "checkpoint": checkpoint,
                    "wandb": tracker.run_path,
                },
                wandb_sync=sync_command(wandb_segments) if offline else None,
            )
            | tracker.identity()
        )
        # As TRL ran it: the group size and the per-process batch it derived, over this many processes.
        summary |= {
            "trl_num_generations": trainer.num_generations,
            "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
            "processes": trainer.accelerator.num_processes,
        }
        if validation:
            summary |= validation[0].summary(run_dir)
        if attempt:  # this attempt trained the steps after the checkpoint only
            summary |= {
                "resumed_from": str(attempt.checkpoint),
                "seconds_per_step": train_seconds / max(steps - attempt.step, 1),
            }
        for when, result in (("before", before), ("after", after)):
            if result is not None:
                measured = result.verification | result.rollout | result.judge
                summary |= {f"heldout_{k.replace('/', '_')}_{when}": v for k, v in measured.items()}
        write_summary(summary, run_dir / SUMMARY_FILE)
        tracker.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
        failed = False
    finally:
        tracker.finish(failed)
    print_summary(summary)
    return summary


def heldout_before(
    model, tokenizer, heldout, parts, spec: RunSpec, run_dir: Path, attempt: Attempt | None, benchmark=None
):
    """Held-out accuracy before training; a resumed run takes its first attempt's (measured on the initial model)."""
    recorded = attempt.record.get("heldout_before") if attempt else None
    if recorded:
        return EvalResult(**recorded)
    if not spec.cfg.eval.before:
        return None
    return measure_heldout(model, tokenizer, heldout, parts, spec, run_dir, "before", benchmark)


def asdict_light(result: EvalResult) -> dict:
    """What a later attempt needs of an evaluation (the per-problem samples are in eval_<when>.jsonl)."""
    return {
        "accuracy": result.accuracy,
        "correct": result.correct,
        "scored": result.scored,
        "verification": result.verification,
        "rollout": result.rollout,
        "judge": result.judge,
    }


def report_finished(attempt: Attempt, run_dir: Path) -> dict:
    """trainer.resume=auto found this run already finished: report it (its files are now in run_dir too)."""
    summary = json.loads((attempt.run_dir / SUMMARY_FILE).read_text()) | {"resumed_from": str(attempt.run_dir)}
    if is_main_process():
        write_summary(summary, run_dir / SUMMARY_FILE)
        log.info("trainer.resume=auto: this run already finished in %s; nothing to train", attempt.run_dir)
        print_summary(summary)
    return summary


@contextmanager
def interruptible(trainer):
    """Ctrl-C, SIGTERM (Slurm's time limit, preemption) or a crash mid-training: save a resumable checkpoint
    of the last completed step first, so that trainer.resume=auto continues from there.

    Not under several processes: saving makes collective calls, which a rank that failed alone would make with
    no partner (a hang, or data paired with another call); it fails at once instead, and the launcher ends the
    other ranks. trainer.resume=auto continues from the last checkpoint of trainer.save_steps."""
    previous = signal.getsignal(signal.SIGTERM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # raise KeyboardInterrupt instead of dying
    try:
        yield
    except BaseException:
        if world_size() == 1:
            save_resumable_checkpoint(trainer)
        else:
            log.error(
                "Training stopped at step %d on rank %d of %d; no checkpoint saved on failure under several "
                "processes (trainer.resume=auto continues from the last one of trainer.save_steps)",
                trainer.state.global_step,
                trainer.accelerator.process_index,
                world_size(),
            )
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def save_resumable_checkpoint(trainer) -> None:
    """Never let this mask the original error (an out-of-memory error may well strike again while saving)."""
    step = trainer.state.global_step
    if step == 0 or is_complete(Path(trainer.args.output_dir) / f"checkpoint-{step}"):
        return
    try:
        trainer.save_checkpoint()
        log.warning("Training stopped at step %d; resumable checkpoint saved in %s", step, trainer.args.output_dir)
    except Exception as err:  # noqa: BLE001
        log.warning("Could not save a checkpoint of the interrupted run: %s", err)


def _accuracy(result: EvalResult | None) -> float | None:
    return result.accuracy if result else None
