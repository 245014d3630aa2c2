"""`python -m tests.helpers.recorded_run <record_dir> <overrides...>` under `accelerate launch`: the training CLI,
with every torch.distributed call each rank makes written to <record_dir>/rank<N>.jsonl (the call's name and where
grpo_exp/TRL/accelerate/transformers made it), line by line, so that a rank that dies or hangs leaves its record.

Every rank must make the same collective calls in the same order (gloo aborts on a mismatch, NCCL hangs):
`tests.helpers.recorder.mismatch` compares the records.

Failures to inject, for the tests that show what the recorder and the run do about them (environment variables):
- GRPO_EXP_TEST_FAIL_RANK=<rank>:<step>: that rank raises in the trainer's scoring hook at that (1-based) step;
- GRPO_EXP_TEST_EXTRA_COLLECTIVE=<rank>: that rank alone calls a barrier after its first step's scoring.
"""

import functools
import json
import os
import sys
import threading
import traceback
from pathlib import Path

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# The collectives a rank can make from Python (the point-to-point and the async variants included).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "_broadcast_coalesced",  # DDP's buffer broadcast at every forward
)
CALLERS = ("grpo_exp", "trl", "accelerate", "transformers")


def record_collectives(path: Path) -> None:
    """Wrap each collective so that its outermost call (all_gather_object calls all_gather: one record) is written
    to `path` before it runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("a", encoding="utf-8", buffering=1)
    inside = threading.local()

    def wrap(name, function):
        @functools.wraps(function)
        def recorded(*args, **kwargs):
            if getattr(inside, "depth", 0):
                return function(*args, **kwargs)
            out.write(json.dumps({"call": name, "site": _caller()}) + "\n")
            inside.depth = 1
            try:
                return function(*args, **kwargs)
            finally:
                inside.depth = 0

        return recorded

    for name in COLLECTIVES:
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None:
            continue
        wrapped = wrap(name, original)
        for module in (c10d, dist):
            if hasattr(module, name):
                setattr(module, name, wrapped)


def _caller() -> str:
    """Who made the call: the innermost frame of grpo_exp, else of TRL, accelerate, transformers (in that order)."""
    stack = traceback.extract_stack()[:-2]
    for library in CALLERS:
        for frame in reversed(stack):
            if library in Path(frame.filename).parts:
                return f"{library}:{Path(frame.filename).name}:{frame.lineno}:{frame.name}"
    return "?"


def inject_failures() -> None:
    """The failures named by the environment (module docstring), through the trainer's scoring hook."""
    failing = os.environ.get("GRPO_EXP_TEST_FAIL_RANK")
    extra = os.environ.get("GRPO_EXP_TEST_EXTRA_COLLECTIVE")
    if not (failing or extra):
        return
    from grpo_exp.trainer.trainer import GRPOExpTrainer

    rank = int(os.environ.get("RANK", "0"))
    original = GRPOExpTrainer.after_scoring

    def after_scoring(self, batch):
        step = self.state.global_step + 1
        if failing and (rank, step) == tuple(int(x) for x in failing.split(":")):
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        original(self, batch)
        if extra and rank == int(extra) and step == 1:
            dist.barrier()

    GRPOExpTrainer.after_scoring = after_scoring


if __name__ == "__main__":
    record_dir = Path(sys.argv.pop(1))
    record_collectives(record_dir / f"rank{os.environ.get('RANK', '0')}.jsonl")
    inject_failures()
    from grpo_exp.train import main

    main()
