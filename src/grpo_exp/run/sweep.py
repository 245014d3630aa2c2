"""A Hydra callback for multiruns: each job's status on disk, and one table of the whole sweep at the end.

Hydra raises the first failed job's error once every job has run, before `on_multirun_end`; the table is
then printed on the way out (atexit), failed jobs included, so that one failure does not hide the others.
"""

import atexit
import json
import logging
from pathlib import Path

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from rich.console import Console

from grpo_exp.analysis.comparison import compare, discover_runs, print_failures, print_table
from grpo_exp.run.distributed import is_main_process
from grpo_exp.run_files import STATUS_FILE

log = logging.getLogger(__name__)


def job_status(job_return) -> dict:
    status = {"status": "finished" if job_return.status == JobStatus.COMPLETED else "failed"}
    error = getattr(job_return, "_return_value", None)  # the exception of a failed job (`return_value` re-raises)
    if job_return.status == JobStatus.FAILED and isinstance(error, BaseException):
        status["error"] = f"{type(error).__name__}: {error}".strip()[:2000]
    return status


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.sweep_dir: Path | None = None
        self.reported = False

    def on_multirun_start(self, config, **kwargs) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir)
        atexit.register(self.report)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if is_main_process():
            status_file = Path(config.hydra.runtime.output_dir) / STATUS_FILE
            status_file.write_text(json.dumps(job_status(job_return), indent=2), encoding="utf-8")

    def on_multirun_end(self, config, **kwargs) -> None:
        self.report()

    def report(self) -> None:
        if self.reported or self.sweep_dir is None or not is_main_process():
            return
        self.reported = True
        runs = discover_runs([self.sweep_dir])
        if not runs:
            return
        try:
            rows, written = compare(runs, self.sweep_dir / "compare")
        except Exception as err:  # noqa: BLE001 - a summary must not turn a finished sweep into a failed one
            log.warning("Could not summarise the sweep: %s", err)
            return
        console = Console(width=160)
        print_table(rows, console, title=f"sweep {self.sweep_dir}")
        print_failures(runs, console)
        console.print(f"Tables and plots: {self.sweep_dir / 'compare'} ({len(written)} files)")
