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
    if Path(shared[0]) != run_dir:
        leave_own_run_dir(run_dir, Path(shared[0]), int(os.environ.get("RANK", "0")))
    return Path(shared[0])


def leave_own_run_dir(own: Path, shared: Path, rank: int) -> None:
    """A rank whose clock named another run directory than the main process's: its log goes on in the shared one
    (train.rank<N>.log, what it logged so far moved there) and its own directory, which holds nothing of the run
    but Hydra's record of the job, goes (outputs/runs had a stray directory for each such rank)."""
    import logging
    import shutil

    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == own:
            handler.close()
            moved = shared / f"{Path(handler.baseFilename).stem}.rank{rank}.log"
            shutil.move(handler.baseFilename, moved)
            handler.baseFilename, handler.mode = str(moved), "a"  # reopened there at the next record
    if {path.name for path in own.iterdir()} <= {".hydra"}:
        shutil.rmtree(own)


# DeepSpeed's name for its shared-memory all-reduce (deepspeed/ops/op_builder/cpu/comm.py: ShareMemCommBuilder)
SHM_OP = "deepspeed_shm_comm"


def no_deepspeed_shm_op_on_cpu() -> None:
    """DeepSpeed on CPU processes without compiling its shared-memory all-reduce: when its process group starts,
    DeepSpeed compiles that C++ extension (30-80 s on 2 cores, and a compiler is required), and only tensor-parallel
    inference uses it, never ZeRO training. DeepSpeed builds it where `deepspeed.ops.__compatible_ops__`, its own
    cache of which ops this machine can build, says it can: set here before anything asks, which also spares the
    probe of every other op (a compiler run each). Nothing else in DeepSpeed reads that cache."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return
    import torch

    if torch.cuda.is_available():
        return
    import deepspeed.ops

    cache = vars(deepspeed.ops)
    if "__compatible_ops__" in cache:
        cache["__compatible_ops__"][SHM_OP] = False
    else:
        cache["__compatible_ops__"] = {SHM_OP: False}


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
