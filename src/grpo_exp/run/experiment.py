"""One training job, top to bottom: resolve the config (every check) -> build the parts -> load the data, tokenizer
and policy -> open the tracker -> the warm-up stage (warmup=sft) -> the held-out evaluation -> the trainer with its
callbacks -> train -> evaluate after -> summary."""

import json
import logging
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import PrinterCallback, ProgressCallback, set_seed

from grpo_exp.analysis.diagnosis import diagnose, read_run
from grpo_exp.freed_memory import return_freed_memory
from grpo_exp.models import describe, load_tokenizer, lora_config
from grpo_exp.rewards.components import graded_components
from grpo_exp.rollout.native import with_system
from grpo_exp.run.build import RunParts
from grpo_exp.run.console import ConsoleView
from grpo_exp.run.distributed import is_main_process, shared_run_dir
from grpo_exp.run.evaluation import BeforeTraining, HeldoutEval, OnPolicy
from grpo_exp.run.health import PolicyHealth
from grpo_exp.run.interruption import interruptible
from grpo_exp.run.kept_models import KeptModels, carry_best
from grpo_exp.run.memory_check import check_run_memory, hand_back_freed_memory
from grpo_exp.run.probe_first import probe_first
from grpo_exp.run.report import build_summary, print_summary, write_summary
from grpo_exp.run.resolve import RunSpec, resolve
from grpo_exp.run.resume import Attempt, carry_history, remove_checkpoints
from grpo_exp.run.sample_log import SampleLog
from grpo_exp.run.setup import HELDOUT, TRAINING, load_policy, set_up
from grpo_exp.run.tracking import MetricsFileCallback, Tracker, run_identity
from grpo_exp.run.validation import PeriodicValidation, Schedule
from grpo_exp.run.wandb_offline import RECORD_KEY, segments_so_far, sync_command
from grpo_exp.run.warmup.stage import WarmupStage, warm_up
from grpo_exp.run_files import (
    CONFIG_FILE,
    FINAL_CHECKPOINT_DIR,
    METRICS_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    TRAINER_DIR,
    WARMUP_DIR,
)
from grpo_exp.trainer.config import ddp_timeout
from grpo_exp.trainer.curriculum import STATE_FILE as CURRICULUM_FILE
from grpo_exp.trainer.curriculum import DifficultyPool, SaveState
from grpo_exp.trainer.levels import STATE_FILE as LEVELS_FILE
from grpo_exp.trainer.levels import LevelChooser, TaskLevels
from grpo_exp.trainer.trainer import GRPOExpTrainer
from grpo_exp.trainer.trl_batch import RolloutFunc

log = logging.getLogger("grpo_exp.train")


def run_experiment(cfg: DictConfig, hydra_cfg: DictConfig) -> dict:
    # Deprecation notices from inside transformers/TRL are not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    run_dir = shared_run_dir(Path(hydra_cfg.runtime.output_dir), ddp_timeout(cfg.trainer))
    spec = resolve(cfg, trainer_dir=run_dir / TRAINER_DIR)
    set_seed(cfg.trainer.seed)
    inputs = set_up(spec, checked=(TRAINING, HELDOUT))
    train_set, heldout, parts = inputs.train, inputs.heldout, inputs.parts
    attempt = spec.attempt
    if is_main_process():
        start_run_dir(spec, run_dir)
    if attempt and attempt.finished:
        return report_finished(attempt, run_dir)

    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    run_memory = check_run_memory(spec, list(train_set["prompt"]), tokenizer)  # before the model loads
    hand_back_freed_memory(cfg.trainer.return_freed_memory, run_memory)
    tokenizer, model = load_policy(spec, spec.policy_dtype, tokenizer)
    probed = probe_first(spec, parts, tokenizer, heldout, run_dir)
    tracked = open_tracker(spec, hydra_cfg, run_dir)
    levels = task_levels(spec, train_set, heldout)
    evaluation = HeldoutEval(spec, parts, tokenizer, heldout, run_dir, train_set, levels)
    failed, summary = True, {"heldout_accuracy_after": None}
    try:
        warmed = warm_up(spec, parts, model, tokenizer, train_set, evaluation, run_dir, tracked.tracker)
        trainer = make_trainer(spec, parts, model, tokenizer, train_set, run_dir, tracked.tracker, levels)
        watchers = add_callbacks(trainer, spec, parts, evaluation, tracked, run_dir, probed)
        return_freed_memory()  # what loading freed (the checkpoint's tensors, the probes) off the first step's peak
        started = time.perf_counter()
        with interruptible(trainer):
            trainer.train(resume_from_checkpoint=str(attempt.checkpoint) if attempt and attempt.checkpoint else None)
        times = RunTimes.of(time.perf_counter() - started, evaluation.seconds, watchers.validation_seconds)
        if cfg.eval.after:  # every process, on the model where it trained
            OnPolicy(trainer, evaluation).after_training()
        checkpoint = save_final_model(trainer, spec, run_dir)
        if is_main_process():
            paths = run_paths(run_dir, hydra_cfg, checkpoint, tracked.tracker)
            summary = summarise(spec, trainer, evaluation, watchers, tracked, paths, times, warmed)
        failed = False
    finally:
        tracked.tracker.finish(failed)
    if is_main_process():
        print_summary(summary)
    return summary


# ---- the steps, each one job ----------------------------------------------------------------------------------


def start_run_dir(spec: RunSpec, run_dir: Path) -> None:
    """The resolved config; a resumed run's history and kept models, carried from its earlier attempt."""
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(spec.saved_config), encoding="utf-8")
    if spec.attempt:
        carry_history(spec.attempt, run_dir)
        carry_best(spec.attempt.run_dir, run_dir, spec.attempt.step)


@dataclass
class TrackedRun:
    """The tracker run of this job and its identity: name, and (offline W&B) every attempt's segment."""

    tracker: Tracker
    name: str
    wandb_segments: list

    @property
    def record(self) -> dict:
        """What a resumed attempt needs to continue this tracker run."""
        return {"wandb_id": self.tracker.run_id, RECORD_KEY: self.wandb_segments}

    @property
    def sync_command(self) -> str | None:
        return sync_command(self.wandb_segments) if self.tracker.mode == "offline" else None


def open_tracker(spec: RunSpec, hydra_cfg: DictConfig, run_dir: Path) -> TrackedRun:
    """The tracker run (main process only), named by what differs, grouped by sweep, tagged with the choices; a
    resumed run continues its earlier attempt's."""
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra") and v}
    name, group = run_identity(hydra_cfg)
    tags = [f"{k}:{v}" for k, v in choices.items()]
    run_id = spec.attempt.record.get("wandb_id") if spec.attempt else None
    config = {**spec.saved_config, "choices": choices}
    main = is_main_process()
    tracker = Tracker(spec.cfg.logger, run_dir, name, group, tags, config, run_id, enabled=main)
    # An offline W&B run continued here: every attempt's segment, oldest first (`wandb sync` needs them all).
    offline = tracker.run_path if tracker.mode == "offline" else None
    return TrackedRun(tracker, name, segments_so_far(spec.attempt, offline, run_id) if main else [])


def make_trainer(
    spec: RunSpec,
    parts: RunParts,
    model,
    tokenizer,
    train_set,
    run_dir: Path,
    tracker: Tracker,
    levels: TaskLevels | None,
):
    cfg = spec.cfg
    sample_log = SampleLog(run_dir / SAMPLES_FILE, tracker)
    pool = difficulty_pool(spec, train_set)
    chooser = pool if levels is None else LevelChooser(levels, pool, cfg.trainer.seed)
    trainer = GRPOExpTrainer(
        verifier=parts.verifier,
        stats_cfg=cfg.stats,
        selfverify=parts.tasks.get("selfverify"),
        curriculum=chooser,
        log_histograms=tracker.log_histograms,
        log_samples=sample_log.write,
        model=model,
        reward_funcs=parts.reward_funcs,
        args=spec.args,
        train_dataset=with_system(train_set, cfg.rollout.system) if spec.native_tool_calling else train_set,
        processing_class=tokenizer,
        peft_config=lora_config(cfg.model),
        **rollout_arguments(parts),
    )
    tracker.attach(trainer)  # TRL's report_to callback logs into this job's tracker run
    for dict_dump in (ProgressCallback, PrinterCallback):  # they print all 50+ metrics; ConsoleView shows a few
        trainer.remove_callback(dict_dump)
    parts.bind_policy(trainer.model, tokenizer)
    if pool is not None:
        trainer.add_callback(SaveState(pool, CURRICULUM_FILE))
    if levels is not None:
        trainer.add_callback(SaveState(levels, LEVELS_FILE))
    return trainer


def rollout_arguments(parts: RunParts) -> dict:
    """How the trainer generates: a multi-turn run through grpo_exp's loop (TRL's rollout_func) or through TRL's
    tool-calling loop (environment_factory); else TRL's own single-turn generation."""
    if parts.environment_factory is not None:
        return {"environment_factory": parts.environment_factory}
    return {"rollout_func": None if parts.rollout is None else RolloutFunc(parts.rollout)}


def task_levels(spec: RunSpec, train_set, heldout) -> TaskLevels | None:
    """dataset.levels.enabled: each task's level, from its start; a resumed run's, from its checkpoint."""
    levels_cfg = spec.cfg.dataset.levels
    if not levels_cfg.enabled:
        return None
    rows = [list(zip(split["task_name"], split["task_level"], strict=True)) for split in (train_set, heldout)]
    start, top = {}, {}  # each task's range: the levels its rows were generated at
    for task, level in rows[0] + rows[1]:
        start[task], top[task] = min(start.get(task, level), level), max(top.get(task, level), level)
    levels = TaskLevels(*rows, start, top, levels_cfg.threshold)
    if spec.attempt and spec.attempt.checkpoint:
        levels.load(spec.attempt.checkpoint / LEVELS_FILE)
    return levels


def difficulty_pool(spec: RunSpec, train_set) -> DifficultyPool | None:
    """curriculum.enabled: the pool of the training prompts' pass rates; a resumed run's, from its checkpoint."""
    curriculum = spec.cfg.curriculum
    if not curriculum.enabled:
        return None
    settings = (curriculum.low, curriculum.high, curriculum.revisit, curriculum.window, spec.cfg.trainer.seed)
    pool = DifficultyPool(train_set["question"], *settings)
    if spec.attempt and spec.attempt.checkpoint:
        pool.load(spec.attempt.checkpoint / CURRICULUM_FILE)
    return pool


@dataclass(frozen=True)
class RunTimes:
    """trainer.train()'s wall time, split: `validation` (the evaluation before training, the verification benchmark
    then, and every validation with the best models it keeps) and `train` (the rest: the steps)."""

    wall: float
    validation: float

    @property
    def train(self) -> float:
        return self.wall - self.validation

    @classmethod
    def of(cls, wall: float, *validating: float) -> "RunTimes":
        return cls(wall, sum(validating))


@dataclass
class Watchers:
    """What watched the run and goes in its summary: validations (eval.every), the policy's health, the reward probe's
    findings (probe.before_training)."""

    validation: PeriodicValidation | None
    health: PolicyHealth
    probe_findings: list[str] | None

    @property
    def validation_seconds(self) -> float:
        return self.validation.seconds if self.validation else 0.0

    def summary(self) -> dict:
        validated = self.validation.summary() if self.validation else {}
        return validated | self.health.summary() | {"probe_findings": self.probe_findings}


def add_callbacks(
    trainer,
    spec: RunSpec,
    parts: RunParts,
    evaluation: HeldoutEval,
    tracked: TrackedRun,
    run_dir: Path,
    probe_findings: list[str] | None,
) -> Watchers:
    """In this order: the evaluation before training, validations (eval.every), the policy's health, metrics.jsonl,
    the console."""
    eval_cfg, on_policy = spec.cfg.eval, OnPolicy(trainer, evaluation)
    trainer.add_callback(BeforeTraining(on_policy, spec.attempt, tracked.record))
    validation = None
    if eval_cfg.every:
        kept = KeptModels(run_dir, trainer.save_model_to, eval_cfg.best_metric, eval_cfg.keep_top_k)
        learned = tuple(func.__name__ for func in parts.reward_funcs if func.__name__ in graded_components())
        validation = PeriodicValidation(
            Schedule.of(eval_cfg, len(evaluation.problem_rows())),
            validate=on_policy.validate,
            record=trainer.record_metric,
            log_now=trainer.log,
            kept=kept,
            learned=learned,
            initial=on_policy.initial,
        )
        trainer.add_callback(validation)
    completions_per_step = spec.args.generation_batch_size  # what TRL's clipped ratio is a share of
    health = PolicyHealth(spec.cfg.health, completions_per_step, run_dir / METRICS_FILE)
    trainer.watch_logs_first(health)
    trainer.watch_answers(health.observe_answers)
    trainer.add_callback(MetricsFileCallback(run_dir / METRICS_FILE))
    trainer.add_callback(ConsoleView(evaluation.accuracy_before))
    return Watchers(validation, health, probe_findings)


def save_final_model(trainer, spec: RunSpec, run_dir: Path) -> Path | None:
    """checkpoint-final (every rank: DeepSpeed/FSDP gather their shards here); the resumable checkpoints dropped
    unless trainer.keep_checkpoints."""
    checkpoint = run_dir / FINAL_CHECKPOINT_DIR if spec.cfg.save_model else None
    if checkpoint:
        trainer.save_model_to(checkpoint)
    if not spec.cfg.trainer.keep_checkpoints and is_main_process():
        remove_checkpoints(run_dir)
    return checkpoint


def run_paths(run_dir: Path, hydra_cfg: DictConfig, checkpoint: Path | None, tracker: Tracker) -> dict:
    return {
        "run_dir": run_dir,
        "config": run_dir / CONFIG_FILE,
        "metrics": run_dir / METRICS_FILE,
        "log": run_dir / f"{hydra_cfg.job.name}.log",
        "checkpoint": checkpoint,
        "wandb": tracker.run_path,
    }


def summarise(
    spec: RunSpec,
    trainer,
    evaluation: HeldoutEval,
    watchers: Watchers,
    tracked: TrackedRun,
    paths: dict,
    times: RunTimes,
    warmed: WarmupStage | None = None,
) -> dict:
    """summary.json and the tracker's summary: what was trained, how it went, where everything is (main process);
    with a warm-up, what it did and the held-out measures before it (those `before` are then after it)."""
    cfg, attempt, steps = spec.cfg, spec.attempt, trainer.state.global_step
    sizes = (len(trainer.train_dataset), len(evaluation.heldout))
    train_seconds = times.train
    summary = build_summary(
        cfg, tracked.name, describe(cfg.model, trainer.model), sizes, steps, train_seconds, paths, tracked.sync_command
    )
    summary |= {"validation_seconds": times.validation, "wall_seconds": times.wall}
    summary |= tracked.tracker.identity() | trainer.batch_layout() | evaluation.summary()
    summary |= watchers.summary()
    if warmed is not None:
        summary |= warmed.summary()
    if attempt:  # this attempt trained the steps after the checkpoint only
        seconds_per_step = train_seconds / max(steps - attempt.step, 1)
        resumed_from = attempt.checkpoint or attempt.run_dir / WARMUP_DIR  # a GRPO checkpoint, or a warm-up ended
        summary |= {"resumed_from": str(resumed_from), "seconds_per_step": seconds_per_step}
    summary["diagnosis"] = [f.row() for f in diagnose(replace(read_run(paths["run_dir"]), summary=summary))]
    write_summary(summary, paths["run_dir"] / SUMMARY_FILE)
    tracked.tracker.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    return summary


def report_finished(attempt: Attempt, run_dir: Path) -> dict:
    """trainer.resume=auto found this run already finished: report it (its files are now in run_dir too)."""
    summary = json.loads((attempt.run_dir / SUMMARY_FILE).read_text()) | {"resumed_from": str(attempt.run_dir)}
    if is_main_process():
        write_summary(summary, run_dir / SUMMARY_FILE)
        log.info("trainer.resume=auto: this run already finished in %s; nothing to train", attempt.run_dir)
        print_summary(summary)
    return summary
