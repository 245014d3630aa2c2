"""`python -m grpo_exp.train`: compose the config, train with TRL's GRPOTrainer, evaluate, summarise.

The training job itself lives in grpo_exp.run.experiment, imported on demand so that `--help` and
`--cfg job` answer without loading torch and TRL.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grpo_exp.deprecated import translate_argv, with_old_names
from grpo_exp.errors import UserError
from grpo_exp.import_collection import without_collection
from grpo_exp.paths import CONF_DIR
from grpo_exp.process_exit import run_then_exit
from grpo_exp.run.config_store import register_schemas

register_schemas()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the held-out accuracy after training (the objective of Hydra sweepers such as Optuna)."""
    from grpo_exp.run.cluster import export_torch_distributed_env

    # The tasks of a Slurm job (hydra/launcher=slurm_multigpu) form one process group; set before anything reads them.
    export_torch_distributed_env()
    with without_collection():  # torch, transformers, TRL...: about a million objects (grpo_exp.import_collection)
        from grpo_exp.run.distributed import (
            destroy_process_group_at_exit,
            no_deepspeed_shm_op_on_cpu,
            wait_for_everyone,
        )
        from grpo_exp.run.experiment import run_experiment

    destroy_process_group_at_exit()
    no_deepspeed_shm_op_on_cpu()  # before accelerate starts DeepSpeed's process group
    try:
        summary = run_experiment(cfg, HydraConfig.get())
    except UserError as err:
        raise UserError(with_old_names(str(err))) from err.__cause__
    wait_for_everyone()  # no rank leaves (and destroys the group) while another is in a collective; on success only
    return summary["heldout_accuracy_after"]


if __name__ == "__main__":
    sys.argv[1:] = translate_argv(sys.argv[1:])  # old names (verifier=genrm...): the new, with a warning
    run_then_exit(main)  # without the interpreter's last collections of a million objects (grpo_exp.process_exit)
