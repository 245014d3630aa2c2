"""A training stage stopped by Ctrl-C, SIGTERM (Slurm's time limit, preemption) or a crash: its last completed step
saved first as a resumable checkpoint, so that trainer.resume=auto continues from there."""

import logging
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from grpo_exp.run.distributed import world_size
from grpo_exp.run.resume import is_complete
from grpo_exp.trainer.trl_surface import save_checkpoint

log = logging.getLogger(__name__)


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
        save_checkpoint(trainer)
        log.warning("Training stopped at step %d; resumable checkpoint saved in %s", step, trainer.args.output_dir)
    except Exception as err:  # noqa: BLE001
        log.warning("Could not save a checkpoint of the interrupted run: %s", err)
