"""A tiny training run in a fresh process, as `python -m grpo_exp.train` runs it, against the same run with one of
its start-up or exit measures undone, alternating:
`python -m benchmarks.cold_start [--repeats 3] [--undo imports|exit]`.

- imports: the model libraries imported with the cyclic collector on (`without_collection`, grpo_exp.import_collection,
  replaced by a context that changes nothing);
- exit: the interpreter's own exit, its modules torn down and its heap walked (`run_then_exit`, grpo_exp.process_exit,
  replaced by a plain call).

The run's wall-clock and CPU seconds (user + system, its children included) from start to exit: mostly imports and
the exit at this size, which is what every command pays.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.heldout_eval import cpu_name
from grpo_exp.measures import paired_change
from support.config import TINY_RUN

RUN = [*TINY_RUN, "reward=math+format+length", "logger=none"]
# the run as `python -m grpo_exp.train` starts it, after `undo`
UNDONE = (
    "import contextlib, runpy, sys; {undo}; "
    "sys.argv[0] = 'grpo_exp.train'; runpy.run_module('grpo_exp.train', run_name='__main__', alter_sys=True)"
)
UNDO = {
    "imports": (
        "its imports walked by the collector",
        "import grpo_exp.import_collection as imports; imports.without_collection = contextlib.nullcontext",
    ),
    "exit": (
        "its modules torn down at exit",
        "import grpo_exp.process_exit as ending; ending.run_then_exit = lambda command, *args: command(*args)",
    ),
}


def timed(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of `command`, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run([*command, *RUN, f"hydra.run.dir={run_dir}"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_start")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--undo", choices=sorted(UNDO), default="imports", help="the measure the other arm undoes")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    undone, undo = UNDO[args.undo]
    variants = {
        "as it runs": [sys.executable, "-m", "grpo_exp.train"],
        undone: [sys.executable, "-c", UNDONE.format(undo=undo)],
    }
    print(f"A tiny run in a fresh process ({' '.join(RUN)}), {cpu_name()}, {os.cpu_count()} cores")
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, command in variants.items():
            seconds[name].append(timed(command))
            wall, cpu = seconds[name][-1]
            print(f"repeat {repeat + 1}, {name}: {wall:.1f} s, CPU {cpu:.1f} s", flush=True)
    (new_wall, new_cpu), (old_wall, old_cpu) = (
        (statistics.median(w for w, _ in seconds[name]), statistics.median(c for _, c in seconds[name]))
        for name in variants
    )
    print(f"medians of {args.repeats}: wall {new_wall:.1f} s against {old_wall:.1f} s ({new_wall / old_wall:.2f}x),")
    print(f"CPU {new_cpu:.1f} s against {old_cpu:.1f} s ({new_cpu / old_cpu:.2f}x)")
    saved, low, high = paired_change(*([w for w, _ in seconds[name]] for name in variants))
    print(f"wall saved, paired: mean {saved:.1f} s, 95% t [{low:.1f}, {high:.1f}] s")


if __name__ == "__main__":
    main()
