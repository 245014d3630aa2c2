"""A cluster scheduler's job with several tasks (hydra/launcher=slurm_multigpu): torch.distributed's variables.

hydra-submitit-launcher starts every task of a job on the same pickled Hydra job, and Slurm (or submitit's local
executor) numbers the tasks in its own variables (SLURM_PROCID, SUBMITIT_LOCAL_GLOBALID, ...). torch.distributed's
env:// initialisation, which accelerate's PartialState uses (grpo_exp.run.distributed), reads MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE instead; submitit's TorchDistributedEnvironment maps one to the other.
"""

import os

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE")


def export_torch_distributed_env() -> bool:
    """In a submitit job with more than one task, set torch.distributed's variables from submitit's job
    environment (MASTER_ADDR: the job's first node; MASTER_PORT: drawn from the job id, or $MASTER_PORT if set;
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: the task's). Returns whether it set them.

    Nothing happens outside a submitit job (submitit marks its jobs with SUBMITIT_EXECUTOR; checked first so that
    plain runs import nothing), in a one-task job, or when a launcher inside the job (torchrun, accelerate launch)
    has set RANK/WORLD_SIZE already.
    """
    if not os.environ.get("SUBMITIT_EXECUTOR") or any(name in os.environ for name in LAUNCHER_VARIABLES):
        return False
    import submitit

    job = submitit.JobEnvironment()
    if job.num_tasks == 1:
        return False
    # CUDA_VISIBLE_DEVICES stays as Slurm set it: accelerate picks GPU LOCAL_RANK modulo the visible ones, right
    # both when every task sees all the node's GPUs and when Slurm binds one GPU per task (submitit's default,
    # CUDA_VISIBLE_DEVICES=LOCAL_RANK, would hide the task's GPU in the latter case).
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return True
