"""Where a default step's time goes: `python -m benchmarks.step_parts [--steps 6] [overrides...]`.

Runs the default experiment (`make train`'s settings, whatever this CPU's defaults are) for STEPS steps in this
process, with timers around its parts, and prints each part's seconds per step, steps 2 on (the first step pays
the sampling copy's creation and the allocator's first growth). Run it twice, once under other CPU kernels, to see
where a machine class loses, e.g. an AVX2-only CPU's on an AVX-512 one (BENCHMARKS.md):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m benchmarks.step_parts

Parts (nested ones are inside their parent): the step (TRL's step_time: its training_step, which generates,
scores, and runs the loss forward and backward; the optimizer's step comes after it), of which generation and
scoring (TRL's _generate_and_score_completions: the sampling copy's decoding with its refresh, rewards, the
log-probability forwards) and the rest, the loss forward (TRL's compute_loss) and backward.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.overhead_worker import SECONDS, timed

PARTS = {
    "generation and scoring": ("trl", "GRPOTrainer", "_generate_and_score_completions"),
    "  decoding (the sampling copy's)": ("grpo_exp.trainer.sampling", "Sampler", "generate"),
    "    of which its refresh from the policy": ("grpo_exp.trainer.sampling_copy", "SamplingCopy", "sync"),
    "  the loss forward": ("trl", "GRPOTrainer", "compute_loss"),
}
LOSS = "the loss forward and backward (the rest of the step)"


def step_parts(steps: int, overrides: list[str]) -> dict[str, float]:
    """Each part's seconds per step over steps 2..STEPS, and the whole step's (TRL's step_time)."""
    import importlib

    from trl import GRPOTrainer

    from grpo_exp import train
    from grpo_exp.run.tracking import read_metrics

    for name, (module, owner, method) in PARTS.items():
        timed(getattr(importlib.import_module(module), owner), method, name)
    at_step_2, calls = _snapshot_at_second_call(GRPOTrainer, "_generate_and_score_completions")
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["grpo_exp.train", *overrides, f"trainer.max_steps={steps}", f"hydra.run.dir={tmp}/run"]
        sys.argv += ["eval.before=false", "eval.after=false", "save_model=false", "trainer.save_steps=0", "logger=none"]
        train.main()
        step_times = [m["step_time"] for m in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if "step_time" in m]
    if len(calls) != steps:  # the second call must open the second step
        raise SystemExit(f"TRL generated {len(calls)} times in {steps} steps: the step boundary is not known here")
    later = steps - 1
    seconds = {name: (SECONDS[name] - at_step_2.get(name, 0.0)) / later for name in PARTS}
    step = sum(step_times[1:]) / len(step_times[1:])
    generation = {name: value for name, value in seconds.items() if name != "  the loss forward"}
    loss = {LOSS: step - seconds["generation and scoring"], "  the loss forward": seconds["  the loss forward"]}
    return {"the step (TRL's step_time)": step, **generation, **loss}


def _snapshot_at_second_call(owner, name: str) -> tuple[dict[str, float], list]:
    """A dict that holds SECONDS as they were when owner.name was called the second time (the second step's start:
    the first step's generation, training and optimizer step are over by then), and the list of its calls."""
    original, calls, snapshot = getattr(owner, name), [], {}

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            snapshot.update(SECONDS)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)
    return snapshot, calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_parts", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="the experiment's overrides (default: make train's)")
    args = parser.parse_args(argv)
    parts = step_parts(args.steps, args.overrides)
    print(f"seconds per step, steps 2-{args.steps}:")
    for name, seconds in parts.items():
        print(f"  {name:55s} {seconds:7.3f}")
    if args.json:
        args.json.write_text(json.dumps(parts, indent=1))


if __name__ == "__main__":
    main()
