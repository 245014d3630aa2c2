"""Where a step's time goes: `python -m benchmarks.step_parts [--steps 6] [--json FILE] [overrides...]`.

Runs an experiment (`make train`'s settings, or the overrides given, e.g. `generation=vllm_colocate
+experiment=calculator`) for STEPS steps in this process, with timers around its parts, and prints each part's
seconds per step, steps 2 on (the first step pays the sampling copy's creation, the engine's warm-up and the
allocator's first growth). Run it twice, once under other CPU kernels, to see where a machine class loses, e.g. an
AVX2-only CPU's on an AVX-512 one (BENCHMARKS.md):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m benchmarks.step_parts

Parts are nested as they are called: TRL's own profiled blocks (its `profiling_context`s: the weight sync, vLLM's
generate, the rewards, the log-probability forwards, the loss) and grpo_exp's (the sampling copy's decoding, a
multi-turn rollout, its engine's steps, each turn's tool and observation). Under each part, "other" is its time
outside the parts below it; the loss's backward is the step's "other" (TRL's step_time leaves the optimizer's step
out). A multi-turn run also prints when each turn ended, from the rollout's start (the turns of different
trajectories overlap on an engine); every run the tokens the loss read a step (TRL's num_tokens) and the share of
groups without a reward spread (which the default `trainer.zero_variance_groups=skip` leaves out of the loss: a
step whose groups all tie has no loss).
"""

import argparse
import functools
import importlib
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SECONDS: dict[tuple[str, ...], float] = defaultdict(float)
STACK: list[str] = []
# When each turn ended, from its rollout's start: {turn index: [seconds, one per trajectory]}, per rollout
TURN_ENDS: list[dict[int, list[float]]] = []

# grpo_exp's parts (TRL's come from its profiling_context); rows: (module, owner, method, the part's name)
PARTS = [
    ("trl", "GRPOTrainer", "_generate_and_score_completions", "generation and scoring"),
    ("grpo_exp.trainer.sampling", "Sampler", "generate", "the sampling copy's decoding"),
    ("grpo_exp.trainer.sampling_copy", "SamplingCopy", "sync", "its refresh from the policy"),
    ("grpo_exp.rollout.multiturn", "MultiTurnRollout", "run", "the multi-turn rollout"),
    ("grpo_exp.rollout.vllm_turns", "ColocatedTurns", "finished", "the engine's steps"),
    ("grpo_exp.rollout.multiturn", "MultiTurnRollout", "_advance", "each turn's tool and observation"),
    ("grpo_exp.trainer.seam", "HookedGRPOTrainer", "_get_per_token_logps_and_entropies", "log-probability forward"),
    ("grpo_exp.trainer.trl_surface", "TRLSurface", "trainer_log_probs", "the mismatch watch's own forward"),
    ("grpo_exp.trainer.mismatch", "MismatchWatch", "against_trainer", "the sampler against the trainer"),
    ("grpo_exp.trainer.trl_surface", "TRLSurface", "_scored_batch", "the scored batch (group statistics)"),
    ("grpo_exp.trainer.seam", "HookedGRPOTrainer", "after_scoring", "grpo_exp's after-scoring hooks"),
]


class _Part:
    """A named part on the stack while it runs: its wall time adds to SECONDS under the parts it runs within."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        STACK.append(self.name)
        self.started = time.perf_counter()

    def __exit__(self, *exc):
        path = tuple(STACK)
        SECONDS[path] += time.perf_counter() - self.started
        STACK.pop()
        return False


def _timed(owner, method: str, name: str) -> None:
    original = getattr(owner, method)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        with _Part(name):
            return original(*args, **kwargs)

    setattr(owner, method, wrapper)


def _trl_blocks() -> None:
    """TRL's profiling_context blocks as parts, named as TRL names them without the trainer's class."""
    from trl.extras import profiling

    enter, exit_ = profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__

    def entered(self):
        self._part = _Part(self.name.split(".", 1)[-1])
        self._part.__enter__()
        return enter(self)

    def exited(self, *exc):
        self._part.__exit__(*exc)
        return exit_(self, *exc)

    profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__ = entered, exited


def _turn_clock() -> None:
    """TURN_ENDS filled: a new record at each multi-turn rollout, each trajectory's turn end added as it happens."""
    from grpo_exp.rollout.multiturn import MultiTurnRollout

    run, advance = MultiTurnRollout.run, MultiTurnRollout._advance

    def timed_run(self, *args, **kwargs):
        TURN_ENDS.append(defaultdict(list))
        self._started = time.perf_counter()
        return run(self, *args, **kwargs)

    def timed_advance(self, trajectory, *args, **kwargs):
        observation = advance(self, trajectory, *args, **kwargs)
        TURN_ENDS[-1][len(trajectory.turns)].append(time.perf_counter() - self._started)
        return observation

    MultiTurnRollout.run, MultiTurnRollout._advance = timed_run, timed_advance


def per_step(after: dict[tuple[str, ...], float], before: dict[tuple[str, ...], float], steps: int) -> dict:
    """Each part's seconds per step between two snapshots of SECONDS over `steps` steps, with an "other" under each
    part that has parts within it (its time outside them)."""
    seconds = {path: (value - before.get(path, 0.0)) / steps for path, value in after.items()}
    seconds = {path: value for path, value in seconds.items() if value > 0}
    for path in list(seconds):
        within = [value for inner, value in seconds.items() if len(inner) == len(path) + 1 and inner[:-1] == path]
        if within:
            seconds[(*path, "other")] = seconds[path] - sum(within)
    return seconds


def tree_lines(step: float, seconds: dict[tuple[str, ...], float]) -> list[str]:
    """The step and its parts as an indented table, each part under the one it runs within, with its share."""
    lines = [f"{'the step (TRL step_time)':60s} {step:7.3f}  100%"]
    top = sum(value for path, value in seconds.items() if len(path) == 1)
    parts = dict(seconds) | {("other (the loss backward)",): step - top}

    def below(path: tuple[str, ...]) -> None:
        children = [inner for inner in parts if len(inner) == len(path) + 1 and inner[:-1] == path]
        for inner in sorted(children, key=lambda p: (p[-1].startswith("other"), -parts[p])):
            label = "  " * len(inner) + inner[-1]
            lines.append(f"{label:60s} {parts[inner]:7.3f} {100 * parts[inner] / step:4.0f}%")
            below(inner)

    below(())
    return lines


def turn_lines(rollouts: list[dict[int, list[float]]]) -> list[str]:
    """Per turn index: trajectories that played it, and when the last of them ended it, from the rollout's start
    (the mean over the rollouts)."""
    turns = sorted({turn for rollout in rollouts for turn in rollout})
    lines = []
    for turn in turns:
        ends = [max(rollout[turn]) for rollout in rollouts if rollout.get(turn)]
        played = sum(len(rollout.get(turn, [])) for rollout in rollouts) / len(rollouts)
        last = sum(ends) / len(ends)
        lines.append(f"  turn {turn}: {played:4.1f} trajectories a step, the last ended at {last:6.2f} s")
    return lines


def step_parts(steps: int, overrides: list[str]) -> dict:
    from trl import GRPOTrainer

    from grpo_exp import train
    from grpo_exp.run.tracking import read_metrics

    for module, owner, method, name in PARTS:
        _timed(getattr(importlib.import_module(module), owner), method, name)
    _trl_blocks()
    _turn_clock()
    at_step_2, calls = _snapshot_at_second_call(GRPOTrainer, "_generate_and_score_completions")
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["grpo_exp.train", *overrides, f"trainer.max_steps={steps}", f"hydra.run.dir={tmp}/run"]
        sys.argv += ["eval.before=false", "eval.after=false", "save_model=false", "trainer.save_steps=0", "logger=none"]
        train.main()
        metrics = [m for m in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if "step_time" in m]
    if len(calls) != steps:  # the second call must open the second step
        raise SystemExit(f"TRL generated {len(calls)} times in {steps} steps: the step boundary is not known here")
    later = steps - 1
    step = sum(m["step_time"] for m in metrics[1:]) / later
    tokens = (metrics[-1]["num_tokens"] - metrics[0]["num_tokens"]) / later if "num_tokens" in metrics[0] else None
    no_spread = [m["frac_reward_zero_std"] for m in metrics[1:] if "frac_reward_zero_std" in m]
    return {
        "step": step,
        "no_spread": sum(no_spread) / len(no_spread) if no_spread else None,
        "parts": per_step(dict(SECONDS), at_step_2, later),
        "tokens_per_step": tokens,
        "turn_ends": [dict(rollout) for rollout in TURN_ENDS[1:]],
    }


def _snapshot_at_second_call(owner, name: str) -> tuple[dict, list]:
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
    result = step_parts(args.steps, args.overrides)
    print(f"seconds per step, steps 2-{args.steps} ({' '.join(args.overrides) or 'the default run'}):")
    print("\n".join(tree_lines(result["step"], result["parts"])))
    if result["tokens_per_step"] is not None:
        print(f"tokens the loss read a step (TRL's num_tokens): {result['tokens_per_step']:.0f}")
    if result["no_spread"] is not None:
        print(f"groups without a reward spread (TRL's frac_reward_zero_std): {result['no_spread']:.2f}")
    if result["turn_ends"]:
        print("turns, from the rollout's start:")
        print("\n".join(turn_lines(result["turn_ends"])))
    if args.json:
        parts = {" > ".join(path): value for path, value in result["parts"].items()}
        args.json.write_text(json.dumps(result | {"parts": parts}, indent=1))


if __name__ == "__main__":
    main()
