"""Run under `accelerate launch` with 2 processes: the main process sleeps well past the collectives' timeout while
the other waits for it at a barrier, which must give up once the timeout has passed."""

import sys
import time
from datetime import timedelta
from pathlib import Path

from grpo_exp.run.distributed import is_main_process, shared_run_dir, wait_for_everyone

timeout = float(sys.argv[1])
shared_run_dir(Path("unused"), timedelta(seconds=timeout))
if is_main_process():
    time.sleep(4 * timeout)
started = time.monotonic()
try:
    wait_for_everyone()
except Exception as err:  # noqa: BLE001 - whatever the backend raises on a timeout
    print(f"gave up after {time.monotonic() - started:.0f} s: {type(err).__name__}", flush=True)
    sys.exit(3)
print(f"waited {time.monotonic() - started:.0f} s", flush=True)
