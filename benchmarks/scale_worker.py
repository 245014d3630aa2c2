"""One training run of `benchmarks.scale`, in a fresh process (its peak memory is its own).

    python -m benchmarks.scale_worker grpo_exp|trl STEPS OUT.json [overrides...]

`grpo_exp`: `python -m grpo_exp.train` with its defaults (and the overrides), in-process. `trl`: the same experiment
as a bare TRL GRPOTrainer (the same model, data, rewards, seed and settings, GRPOConfig's own defaults otherwise).
Both are watched the same way: a thread samples the resident set every few milliseconds and the trainer's phases are
marked (generation, the loss forward, the backward, the optimiser), so that the peak is placed in its phase; on a GPU,
torch.cuda's peak allocated and reserved bytes are read per phase too.
"""

import ctypes
import functools
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

PHASES = ("load", "generation", "loss forward", "backward", "optimiser", "other")
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo2():
    from grpo_exp.freed_memory import c_function

    function = c_function("mallinfo2")  # glibc 2.33+
    if function is not None:
        function.restype = _MallInfo2
    return function


MALLINFO2 = _mallinfo2()


def heap_bytes() -> tuple[int, int] | None:
    """glibc's view of the process's memory: (bytes in use by live allocations, bytes freed but still held by the
    allocator); None where the C library does not say. The resident set's excess over the first is what the
    allocator keeps, which no tensor accounts for."""
    if MALLINFO2 is None:
        return None
    info = MALLINFO2()
    return info.uordblks + info.hblkhd, info.fordblks


HEAP_EVERY = 20  # samples (100 ms)


class PhaseMemory:
    """The peak resident set (and on a GPU, torch's peak allocated / reserved bytes) of each phase of a run."""

    def __init__(self, interval_s: float = 0.005):
        self.phase = "load"
        self.rss: dict[str, int] = {}
        self.cuda_allocated: dict[str, int] = {}
        self.cuda_reserved: dict[str, int] = {}
        self.heap_at_peak: dict[str, tuple[int, int]] = {}  # (in use, held free) when the phase's peak was seen
        self.live_peak: dict[str, int] = {}  # the largest in use seen in the phase (what the estimate counts)
        self._interval, self._stop = interval_s, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        sampled = 0
        while not self._stop.is_set():
            rss, phase = resident_bytes(), self.phase
            rose = rss > self.rss.get(phase, 0)
            # glibc's count walks its free lists under the arenas' locks (7 ms with 10,000 free blocks): taken when
            # the resident set rises, else every HEAP_EVERY samples, so as not to stall the run it measures
            heap = heap_bytes() if rose or sampled % HEAP_EVERY == 0 else None
            sampled += 1
            if rose:
                self.rss[phase] = rss
                if heap is not None:
                    self.heap_at_peak[phase] = heap
            if heap is not None and heap[0] > self.live_peak.get(phase, 0):
                self.live_peak[phase] = heap[0]
            time.sleep(self._interval)

    def enter(self, phase: str) -> str:
        """Marks `phase` as running; returns the phase it replaces."""
        import torch

        previous = self.phase
        if torch.cuda.is_available():
            self._close_cuda(previous)
            torch.cuda.reset_peak_memory_stats()
        self.phase = phase
        return previous

    def _close_cuda(self, phase: str) -> None:
        import torch

        self.cuda_allocated[phase] = max(self.cuda_allocated.get(phase, 0), torch.cuda.max_memory_allocated())
        self.cuda_reserved[phase] = max(self.cuda_reserved.get(phase, 0), torch.cuda.max_memory_reserved())

    def stop(self) -> None:
        import torch

        self._stop.set()
        self._thread.join()
        if torch.cuda.is_available():
            self._close_cuda(self.phase)

    def in_phase(self, owner, name: str, phase: str) -> None:
        """owner.name runs as `phase` (the phase it interrupted resumes after it)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            previous = self.enter(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.enter(previous if previous != "load" else "other")

        setattr(owner, name, wrapper)


def watch(memory: PhaseMemory) -> None:
    """Marks TRL's phases on the classes both variants train with."""
    from accelerate import Accelerator
    from trl import GRPOTrainer

    memory.in_phase(GRPOTrainer, "_generate", "generation")
    memory.in_phase(GRPOTrainer, "compute_loss", "loss forward")
    memory.in_phase(Accelerator, "backward", "backward")
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def optimiser_step(*_) -> None:
        memory.enter("optimiser")

    def after_optimiser_step(*_) -> None:
        memory.enter("other")

    register_optimizer_step_pre_hook(optimiser_step)  # every optimiser's step (TRL's AdamW)
    register_optimizer_step_post_hook(after_optimiser_step)


def run_grpo_exp(steps: int, out_dir: Path, overrides: list[str]) -> list[float]:
    from grpo_exp import train
    from grpo_exp.run.tracking import read_metrics

    sys.argv = [
        "grpo_exp.train",
        *overrides,
        f"trainer.max_steps={steps}",
        "eval.before=false",
        "eval.after=false",
        # the labels check's greedy answers run before training (24 min at 1,024 tokens): not the step measured
        "probe.labels_check=off",
        "save_model=false",
        "trainer.save_steps=0",
        "logger=none",
        f"hydra.run.dir={out_dir}",
    ]
    train.main()
    metrics = read_metrics(out_dir / "metrics.jsonl")
    return [m["step_time"] for m in metrics if "step_time" in m]


def run_bare_trl(steps: int, out_dir: Path, overrides: list[str]) -> list[float]:
    from benchmarks.overhead_worker import bare_trl_trainer

    trainer, _ = bare_trl_trainer(steps, out_dir, overrides)
    trainer.train()
    return [h["step_time"] for h in trainer.state.log_history if "step_time" in h]


def main() -> None:
    variant, steps, out_file, *overrides = sys.argv[1:]
    memory = PhaseMemory()
    watch(memory)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runner = run_grpo_exp if variant == "grpo_exp" else run_bare_trl
        step_times = runner(int(steps), Path(tmp) / "run", overrides)
    memory.stop()
    result = {
        "variant": variant,
        "overrides": overrides,
        "step_times": step_times,
        "wall_s": time.perf_counter() - started,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "rss_gib_by_phase": {p: memory.rss[p] / 2**30 for p in PHASES if p in memory.rss},
        # at each phase's peak: what live allocations held, and what the allocator held freed (glibc)
        "heap_in_use_gib_at_peak": {p: v[0] / 2**30 for p, v in memory.heap_at_peak.items()},
        "heap_free_held_gib_at_peak": {p: v[1] / 2**30 for p, v in memory.heap_at_peak.items()},
        "heap_in_use_peak_gib": {p: v / 2**30 for p, v in memory.live_peak.items()},
        "cuda_allocated_gib_by_phase": {p: v / 2**30 for p, v in memory.cuda_allocated.items()},
        "cuda_reserved_gib_by_phase": {p: v / 2**30 for p, v in memory.cuda_reserved.items()},
    }
    Path(out_file).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
