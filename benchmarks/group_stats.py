"""Group-statistics overhead: `python -m benchmarks.group_stats` (part of `make bench`).

Trains the embedded model for a few default steps with group statistics on (W&B offline, as by default) and
reports the time spent computing and logging them (`timing/group_stats_s`, measured inside the trainer)
as a share of each step's time (TRL's `step_time`), both from the same steps of one run.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_exp.run.tracking import read_metrics

STEPS = 4


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable,
            "-m",
            "grpo_exp.train",
            f"trainer.max_steps={STEPS}",
            "eval.before=false",
            "eval.after=false",
            "save_model=false",
            "stats.table_every=1",
            f"hydra.run.dir={run_dir}",
        ]
        subprocess.run(command, check=True, capture_output=True)
        steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "timing/group_stats_s" in m]
    stats = sum(m["timing/group_stats_s"] for m in steps) / len(steps)
    step = sum(m["step_time"] for m in steps) / len(steps)
    print(
        f"group statistics: {stats * 1000:.1f} ms per step of {step:.1f} s = {stats / step:.2%} of a step "
        f"(embedded SmolLM2, default config, {len(steps)} steps, W&B offline, a sampled-group table every step)"
    )


if __name__ == "__main__":
    main()
