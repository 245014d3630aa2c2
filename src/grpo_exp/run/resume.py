"""trainer.resume: find an earlier attempt at the same run, and carry its history into this one.

An attempt is a run directory (it has `.hydra/`) whose saved config equals this run's, `trainer.resume`
aside. A finished attempt (summary.json) is reported rather than rerun; an unfinished one is continued
from its last checkpoint, under its W&B run id, in the new run directory (which receives the metrics
and samples logged up to that checkpoint, so that the new directory holds the whole run).
"""

import json
import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from grpo_exp.data_parallel import from_main_process
from grpo_exp.deprecated import renamed_config
from grpo_exp.errors import UserError
from grpo_exp.run_files import (
    ATTEMPT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    TRAINER_DIR,
    WARMUP_DIR,
    WARMUP_SUMMARY,
    eval_file,
    read_json,
    read_jsonl,
    read_yaml,
)

log = logging.getLogger(__name__)

# Logged per step (carried up to the checkpoint) / written once (carried whole from a finished attempt).
STEP_FILES = (METRICS_FILE, SAMPLES_FILE)
RUN_FILES = (eval_file("before"), eval_file("after"), ATTEMPT_FILE)


@dataclass
class Attempt:
    """An earlier attempt of this run, as its files were when the run started: read once (by the main process, under
    several: resolve_attempt), not again as the run writes its own."""

    run_dir: Path
    finished: bool
    checkpoint: Path | None  # GRPO's last complete checkpoint
    record: dict = field(default_factory=dict)
    # its warm-up stage (warmup=sft) ended: GRPO continues from the warmed model, or from its own checkpoint
    warmed_up: bool = False
    # the warm-up's last complete checkpoint (warmup.save_steps), where it stopped mid-warm-up
    warmup_checkpoint: Path | None = None

    @property
    def step(self) -> int:
        return int(self.checkpoint.name.rsplit("-", 1)[1]) if self.checkpoint else 0

    @property
    def continuable(self) -> bool:
        """It left something to continue from: a GRPO checkpoint, or a warm-up ended or checkpointed."""
        return bool(self.checkpoint or self.warmed_up or self.warmup_checkpoint)


def without_resume(config: dict) -> dict:
    trainer = {k: v for k, v in config.get("trainer", {}).items() if k != "resume"}
    return {**config, "trainer": trainer}


def is_complete(checkpoint: Path) -> bool:
    """The trainer state is written last: a checkpoint interrupted while saving has none, or one cut short (SIGTERM
    raised mid-write left an empty trainer_state.json, which transformers then failed to load on resume)."""
    try:
        return isinstance(json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8")), dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def last_checkpoint(trainer_dir: Path) -> Path | None:
    steps = {int(p.name.rsplit("-", 1)[1]): p for p in trainer_dir.glob("checkpoint-*") if p.name[11:].isdigit()}
    complete = [steps[step] for step in sorted(steps) if is_complete(steps[step])]
    return complete[-1] if complete else None


def load_attempt(run_dir: Path) -> Attempt:
    try:
        record = read_json(run_dir / ATTEMPT_FILE)
    except ValueError as err:
        raise UserError(f"trainer.resume: the earlier attempt in {run_dir} cannot be continued: {err}") from None
    finished, checkpoint = (run_dir / SUMMARY_FILE).is_file(), last_checkpoint(run_dir / TRAINER_DIR)
    warmed_up, warmup_checkpoint = (run_dir / WARMUP_SUMMARY).is_file(), last_checkpoint(run_dir / WARMUP_DIR)
    return Attempt(run_dir, finished, checkpoint, record, warmed_up, warmup_checkpoint)


def find_attempt(outputs_dir: Path, config: dict) -> Attempt | None:
    """The most recent earlier attempt with this config that finished or left a checkpoint.

    It may be in this run's own directory: submitit requeues a Slurm job into the directory it had.
    """
    wanted = without_resume(config)
    attempts = []
    for hydra_dir in outputs_dir.rglob(".hydra"):
        run_dir = hydra_dir.parent
        config_file = run_dir / CONFIG_FILE
        if not config_file.is_file() or without_resume(_saved_config(config_file)) != wanted:
            continue
        attempt = load_attempt(run_dir)
        if attempt.finished or attempt.continuable:
            attempts.append((config_file.stat().st_mtime, attempt))
    return max(attempts, key=lambda pair: pair[0])[1] if attempts else None


def _saved_config(config_file: Path) -> dict:
    """A run directory's saved config; {} (no match) where it is damaged: that directory is another run's."""
    try:
        config = read_yaml(config_file)
    except ValueError:
        return {}
    return renamed_config(config) if isinstance(config, dict) else {}


def explicit_attempt(path: Path) -> Attempt:
    """trainer.resume=<dir>: a checkpoint directory, or a run directory (its last checkpoint)."""
    if is_complete(path):
        run_dir = path.parent.parent if path.parent.name == TRAINER_DIR else path.parent
        return replace(load_attempt(run_dir), finished=False, checkpoint=path)  # asked to continue from it
    if (path / "trainer_state.json").is_file():
        raise UserError(
            f"trainer.resume={path}: this checkpoint was cut while it was saved (its trainer_state.json is not whole); "
            "name its run directory to continue from the last complete checkpoint"
        )
    attempt = load_attempt(path) if path.is_dir() else None
    if attempt is None or not attempt.continuable:
        raise UserError(
            f"trainer.resume={path}: not a checkpoint, nor a run directory with checkpoints under trainer/ or a "
            "warm-up (warmup/) to continue from"
        )
    attempt.finished = False  # asked to continue from it explicitly
    return attempt


def resolve_attempt(resume: str | None, outputs_dir: Path, config: dict) -> Attempt | None:
    """The attempt trainer.resume names (`auto`: the last with this config under outputs_dir), or None. Under several
    processes it is the main process's find, for every process: each looking for itself, a process that saw other
    files (a node's own disk; an attempt written between two processes' looks) resumed another attempt, or none, its
    collectives without a partner."""
    if not resume:
        return None
    return from_main_process(lambda: _resolve_attempt(resume, outputs_dir, config))


def _resolve_attempt(resume: str, outputs_dir: Path, config: dict) -> Attempt | None:
    if resume == "auto":
        attempt = find_attempt(outputs_dir, config)
        if attempt is None:
            log.info("trainer.resume=auto: no earlier attempt with this config under %s; starting afresh", outputs_dir)
        return attempt
    return explicit_attempt(Path(resume))


def carry_history(attempt: Attempt, run_dir: Path) -> None:
    """Copy into run_dir what the attempt logged: up to its checkpoint, or everything if it finished."""
    same_dir = attempt.run_dir.resolve() == run_dir.resolve()
    for name in STEP_FILES:
        source = attempt.run_dir / name
        if not source.is_file():
            continue
        try:
            records = read_jsonl(source)  # a last line cut short by the stop is left out
        except ValueError as err:
            raise UserError(f"trainer.resume: the earlier attempt's history cannot be carried over: {err}") from None
        if not attempt.finished:  # steps after the checkpoint will be trained (and logged) again
            records = [record for record in records if record.get("step", 0) <= attempt.step]
        (run_dir / name).write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    for name in RUN_FILES:
        source = attempt.run_dir / name
        if source.is_file() and not same_dir and (attempt.finished or name != "eval_after.jsonl"):
            shutil.copyfile(source, run_dir / name)


def write_record(run_dir: Path, record: dict) -> None:
    (run_dir / ATTEMPT_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")


def remove_checkpoints(run_dir: Path) -> None:
    """A finished run keeps checkpoint-final only: resumable checkpoints hold the optimiser state (3x the model)."""
    for checkpoint in (run_dir / TRAINER_DIR).glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)
