"""What a run of environments changed on its held-out episodes, paired: `python -m benchmarks.episodes_change DIR`.

Reads the run's eval_before.jsonl and eval_after.jsonl (each held-out episode, played greedily before and after
training, the same seeds) and prints, per environment and over all: the episodes won before and after, each with its
95% Wilson interval, and the change with its paired 95% interval (Student t over the per-episode differences: the
same games, so their difficulty cancels). A run with a warm-up (warmup=sft, eval_before_warmup.jsonl) is reported
stage by stage: the warm-up, GRPO after it, and both. `--against OTHER_RUN`: this run's episodes after training
against another's (GRPO alone, say) on the same games. Used for experiments/README.md's environment results.
"""

import argparse
from pathlib import Path

from scipy.stats import binomtest

from benchmarks.arguments import run_directory_with
from grpo_exp.measures import mean_interval
from grpo_exp.run_files import read_jsonl


def won(path: Path) -> dict[str, list[bool]]:
    """Per environment, whether each episode (in file order) succeeded."""
    by_environment: dict[str, list[bool]] = {}
    for sample in read_jsonl(path):
        by_environment.setdefault(sample["environment"], []).append(bool(sample["env_success"]))
    return by_environment


def wilson(wins: int, played: int) -> tuple[float, float]:
    interval = binomtest(wins, played).proportion_ci(0.95, method="wilson")
    return interval.low, interval.high


def report(name: str, before: list[bool], after: list[bool]) -> str:
    change, low, high = mean_interval([float(a) - float(b) for b, a in zip(before, after, strict=True)])
    (bl, bh), (al, ah) = wilson(sum(before), len(before)), wilson(sum(after), len(after))
    return (
        f"{name}: before {sum(before)}/{len(before)} [{bl:.3f}, {bh:.3f}], after {sum(after)}/{len(after)} "
        f"[{al:.3f}, {ah:.3f}], change {change:+.3f} (paired 95% [{low:+.3f}, {high:+.3f}])"
    )


# With a warm-up: each stage's change, from the eval file before it to the one after it.
STAGES = (
    ("warm-up", "eval_before_warmup.jsonl", "eval_before.jsonl"),
    ("GRPO after the warm-up", "eval_before.jsonl", "eval_after.jsonl"),
    ("warm-up + GRPO", "eval_before_warmup.jsonl", "eval_after.jsonl"),
)


def print_change(before: dict[str, list[bool]], after: dict[str, list[bool]]) -> None:
    for name in sorted(before):
        print(report(name, before[name], after[name]))
    if len(before) > 1:
        every = sorted(before)
        print(report("all", [w for n in every for w in before[n]], [w for n in every for w in after[n]]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.episodes_change", description=__doc__)
    ran = run_directory_with("eval_before.jsonl", "eval_after.jsonl")
    parser.add_argument("run_dir", type=ran)
    parser.add_argument("--against", type=ran, help="another run on the same games: its episodes after training first")
    args = parser.parse_args(argv)
    run_dir = args.run_dir
    if args.against is not None:
        print(f"after training, {args.against} (before) against {run_dir} (after):")
        print_change(won(args.against / "eval_after.jsonl"), won(run_dir / "eval_after.jsonl"))
        return
    if not (run_dir / STAGES[0][1]).is_file():
        print_change(won(run_dir / "eval_before.jsonl"), won(run_dir / "eval_after.jsonl"))
        return
    for stage, first, then in STAGES:
        print(f"{stage} ({first} -> {then}):")
        print_change(won(run_dir / first), won(run_dir / then))


if __name__ == "__main__":
    main()
