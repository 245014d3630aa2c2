"""Multi-process training (`accelerate launch`, torchrun): who writes, and one run directory for all ranks.

Every rank runs the whole Hydra job; only the main process evaluates, writes files and logs to W&B.
"""

import atexit
import os
from datetime import timedelta
from pathlib import Path


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def shared_run_dir(run_dir: Path, timeout: timedelta) -> Path:
    """The main process's run directory, on every rank; joining the process group the launcher set up, with
    `timeout` for its collectives (TrainingArguments' ddp_timeout: accelerate's state is made once, here, so the
    trainer's later request for that timeout would find the group made already).

    Each rank composes its own Hydra run directory from the clock, and ranks may start a second apart;
    checkpoints (written by every rank under DeepSpeed ZeRO-3) must all go to one place.
    """
    if world_size() == 1:
        return run_dir
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    PartialState(cpu=not torch.cuda.is_available(), timeout=timeout)
    shared = [str(run_dir)]
    broadcast_object_list(shared, from_process=0)
    return Path(shared[0])


def wait_for_everyone() -> None:
    if world_size() > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def destroy_process_group_at_exit() -> None:
    """The process group destroyed when the interpreter exits, before its finalisation: a gloo group left to the
    garbage collector then can abort a rank ("terminate called without an active exception", SIGABRT) after its
    run has finished, and the launcher reports the run failed. At exit, not at the end of a job: the jobs of a
    Hydra multirun share the group."""
    if world_size() > 1:
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
