"""grpo_exp against bare TRL: `python -m benchmarks.overhead` (part of `make bench`).

Runs the default experiment's training steps (embedded SmolLM2, default task, reward mix, group size and
completion length) as grpo_exp's job and as a bare TRL script, alternating A/B then B/A, each in a fresh
process; prints the step-time ratio, the share of a grpo_exp step spent in its parts, and peak memory.
Both runs use the same seed, so they generate the same completions: the difference is the wrapper.

    python -m benchmarks.overhead [--pairs 3] [--steps 5] [overrides...]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.fresh_process import run_command

VARIANTS = ("grpo_exp", "trl")


def run(variant: str, steps: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.overhead_worker", variant, str(steps), str(out), *overrides]
        completed = run_command(command)
        if completed.returncode != 0:
            raise SystemExit(f"{variant} run failed:\n{completed.stderr[-3000:]}")
        return json.loads(out.read_text())


def per_step(result: dict, steps: int) -> float:
    """Wall time per step of the whole training loop (callbacks and logging included)."""
    return result["train_runtime"] / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for pair in range(args.pairs):
        for variant in VARIANTS if pair % 2 == 0 else VARIANTS[::-1]:
            result = run(variant, args.steps, args.overrides)
            results[variant].append(result)
            print(
                f"  pair {pair + 1} {variant:8s}: {per_step(result, args.steps):6.2f} s/step, "
                f"peak RSS {result['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    wall = {v: statistics.median(per_step(r, args.steps) for r in results[v]) for v in VARIANTS}
    # TRL's own step_time (generation, rewards, loss, backward), steps after the first, pooled over the runs
    inner = {v: statistics.median(t for r in results[v] for t in r["step_times"][1:]) for v in VARIANTS}
    memory = {v: max(r["peak_rss_mb"] for r in results[v]) for v in VARIANTS}
    print(
        f"grpo_exp vs bare TRL ({args.pairs} alternating pairs x {args.steps} steps, medians): "
        f"{wall['grpo_exp']:.2f} vs {wall['trl']:.2f} s/step -> {wall['grpo_exp'] / wall['trl']:.3f}x "
        f"(target <= 1.05x); TRL step_time {inner['grpo_exp']:.2f} vs {inner['trl']:.2f} s -> "
        f"{inner['grpo_exp'] / inner['trl']:.3f}x"
    )
    print(
        f"peak memory (RSS): grpo_exp {memory['grpo_exp']:.0f} MB vs bare TRL {memory['trl']:.0f} MB -> "
        f"{memory['grpo_exp'] / memory['trl']:.3f}x"
    )
    runtime = sum(r["train_runtime"] for r in results["grpo_exp"])
    parts: dict[str, float] = {"verification heads (P(Yes)): none in this reward mix": 0.0}
    for result in results["grpo_exp"]:
        for name, seconds in result["parts"].items():
            parts[name] = parts.get(name, 0.0) + seconds
    print("share of a grpo_exp step (of the training loop's wall time):")
    for name, seconds in sorted(parts.items(), key=lambda item: -item[1]):
        print(f"  {name:55s} {seconds / runtime:7.3%}")


if __name__ == "__main__":
    main()
