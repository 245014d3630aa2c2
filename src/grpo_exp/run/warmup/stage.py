"""The warm-up stage (warmup=sft): the held-out evaluation before it, TRL's SFTTrainer on the demonstrations
(grpo_exp.run.warmup.sources), the warmed model and the stage's record in <run dir>/warmup/. GRPO then trains the same
model object. A resumed run continues from the stage it stopped in: a warm-up that ended is not run again (its
warmed model is loaded where GRPO has no checkpoint of its own yet); one stopped mid-way continues from its last
checkpoint (warmup.save_steps)."""

import gc
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from transformers import PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

from grpo_exp.run.build import RunParts
from grpo_exp.run.distributed import is_main_process, wait_for_everyone
from grpo_exp.run.evaluation import HeldoutEval
from grpo_exp.run.interruption import interruptible
from grpo_exp.run.resolve import RunSpec
from grpo_exp.run.tracking import MetricsFileCallback, Tracker
from grpo_exp.run.warmup.rules import DATA_MAX_LENGTH
from grpo_exp.run.warmup.sources import demonstrations
from grpo_exp.run.warmup.weights import load_weights
from grpo_exp.run_files import METRICS_FILE, WARMUP_DIR, WARMUP_SUMMARY, read_json, read_jsonl
from grpo_exp.schema import WarmupSource

log = logging.getLogger("grpo_exp.train")
MODEL_DIR = "model"  # the warmed model, inside <run dir>/warmup/
PREFIX = "warmup/"  # the stage's metrics in the trackers, apart from GRPO's


@dataclass
class WarmupStage:
    """What the warm-up did (its summary.json), for the run's summary."""

    record: dict

    def summary(self) -> dict:
        return {f"warmup_{key}": value for key, value in self.record.items() if key != "heldout_before"} | {
            f"heldout_{key}_before_warmup": value for key, value in (self.record.get("heldout_before") or {}).items()
        }


class StagePrefix(TrainerCallback):
    """The warm-up's logs under warmup/ for the trackers that read them next (loss -> warmup/loss)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in list(logs or {}):
            logs[f"{PREFIX}{key}"] = logs.pop(key)


def warm_up(
    spec: RunSpec,
    parts: RunParts,
    model,
    tokenizer,
    train_set,
    evaluation: HeldoutEval,
    run_dir: Path,
    tracker: Tracker,
) -> WarmupStage | None:
    """The warm-up, on `model` in place (every process); None without one (warmup=none)."""
    warmup, attempt = spec.cfg.warmup, spec.attempt
    if warmup.source is WarmupSource.none:
        return None
    out_dir = run_dir / WARMUP_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    if attempt and attempt.warmed_up:
        return _carried(attempt, model, out_dir)
    before = None
    if spec.cfg.eval.before:
        result = evaluation.measure(model, "before_warmup")
        before = {"accuracy": result.accuracy} | {k.replace("/", "_"): v for k, v in result.rollout.items()}
    started = time.perf_counter()
    shown = demonstrations(spec, parts, model, tokenizer, train_set, out_dir)
    log.info(
        "Warm-up (warmup.source=%s): %d demonstrations%s; %d steps of SFT",
        warmup.source.value,
        shown.kept,
        f", kept of {shown.played} episodes played" if shown.played is not None else f" from {warmup.data}",
        warmup.steps,
    )
    resume_from = attempt.warmup_checkpoint if attempt else None
    if resume_from is not None and is_main_process():  # its steps up to the checkpoint, logged by the earlier attempt
        _carry_metrics(attempt.run_dir / WARMUP_DIR / METRICS_FILE, out_dir / METRICS_FILE, resume_from)
    trainer = _sft_trainer(spec, model, tokenizer, shown.dataset, out_dir, tracker)
    with interruptible(trainer):  # stopped, its last step saved as GRPO's is (warmup.save_steps or not)
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    trainer.save_model(str(out_dir / MODEL_DIR))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "source": warmup.source.value,
        "steps": trainer.state.global_step,
        **shown.record(),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "seconds": time.perf_counter() - started,
        "heldout_before": before,
    }
    del trainer
    gc.collect()
    if is_main_process():
        (run_dir / WARMUP_SUMMARY).write_text(json.dumps(record, indent=2), encoding="utf-8")
    wait_for_everyone()
    return WarmupStage(record)


def _carry_metrics(source: Path, destination: Path, checkpoint: Path) -> None:
    """The warm-up's metrics of the steps up to `checkpoint` (those after it are trained, and logged, again)."""
    step = int(checkpoint.name.rsplit("-", 1)[1])
    records = [record for record in read_jsonl(source) if record.get("step", 0) <= step]
    destination.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")


def _carried(attempt, model, out_dir: Path) -> WarmupStage:
    """An earlier attempt's warm-up, ended: its record and files carried; its warmed model loaded unless GRPO
    continues from a checkpoint of its own (which holds the weights)."""
    source = attempt.run_dir / WARMUP_DIR
    if not attempt.checkpoint:
        load_weights(model, source / MODEL_DIR)
    if is_main_process() and source.resolve() != out_dir.resolve():
        for name in ("summary.json", METRICS_FILE, "demonstrations.jsonl"):
            if (source / name).is_file():
                shutil.copyfile(source / name, out_dir / name)
    where = f"GRPO's checkpoint {attempt.checkpoint}" if attempt.checkpoint else f"the warmed model in {source}"
    log.info("trainer.resume: the warm-up ended in the earlier attempt; continuing from %s", where)
    return WarmupStage(read_json(source / "summary.json"))


def _sft_trainer(spec: RunSpec, model, tokenizer, dataset, out_dir: Path, tracker: Tracker) -> SFTTrainer:
    """TRL's SFTTrainer on the warm-up's settings and the run's own (seed, precision, device, trackers)."""
    warmup, grpo = spec.cfg.warmup, spec.args
    played = warmup.source is not WarmupSource.dataset
    share = warmup.batch_size // spec.processes
    micro = warmup.micro_batch_size or share
    args = SFTConfig(
        output_dir=str(out_dir),
        max_steps=warmup.steps,
        learning_rate=warmup.learning_rate,
        lr_scheduler_type="constant",
        # a process's share, micro_batch_size rows at a time (each a divisor: grpo_exp.run.warmup.rules)
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=share // micro,
        logging_steps=1,
        save_strategy="steps" if warmup.save_steps else "no",
        save_steps=warmup.save_steps or 500,
        report_to=grpo.report_to,
        seed=grpo.seed,
        bf16=grpo.bf16,
        use_cpu=grpo.use_cpu,
        gradient_checkpointing=grpo.gradient_checkpointing,
        ddp_timeout=grpo.ddp_timeout,
        # played episodes come tokenised, the player's tokens marked (completion_mask); the user's conversations
        # are TRL's to read (prompt-completion: the completion trained; messages: every token)
        completion_only_loss=True if played else None,
        max_length=None if played else DATA_MAX_LENGTH,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    tracker.attach(trainer)
    trainer.callback_handler.callbacks.insert(0, StagePrefix())  # before every tracker's callback
    trainer.callback_handler.callbacks.insert(0, MetricsFileCallback(out_dir / METRICS_FILE))  # its own names
    return trainer
