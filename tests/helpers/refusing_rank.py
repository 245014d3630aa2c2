"""Run under `accelerate launch` with 2 processes: what the main process alone computes for every process
(grpo_exp.data_parallel.from_main_process) refuses the user's input there. Each process prints what it raised and
ends with status 0, so that the launcher stops no process before it has."""

import os
import sys
from datetime import timedelta
from pathlib import Path

from grpo_exp.data_parallel import from_main_process
from grpo_exp.errors import UserError
from grpo_exp.run.distributed import shared_run_dir

REFUSAL = "refused by the main process"


def refuse():
    raise UserError(REFUSAL)


def main(timeout: float) -> int:
    shared_run_dir(Path("unused"), timedelta(seconds=timeout))
    rank = os.environ["RANK"]
    try:
        from_main_process(refuse)
    except UserError as err:
        print(f"rank {rank} raised: {err}", flush=True)
    except Exception as err:  # noqa: BLE001 - whatever the collective raises without its partner
        print(f"rank {rank} failed: {type(err).__name__}: {err}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1])))
