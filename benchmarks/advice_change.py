"""Did a finding's advice work? `python -m benchmarks.advice_change FAILED_RUN ADVISED_RUN [--answer RULE]`.

Two runs of the same task on the same held-out problems: the one a finding was about, and the one that applied the
finding's first setting to try. Prints each run's held-out accuracy before and after training (95% Wilson intervals)
and its paired change, then the advised run's answers after training against the failed run's, paired by problem
(Student t over the per-problem differences). `--answer RULE` labels both runs' answers again with exact_match read
by that built-in rule (where the failed run's own labels were the fault, its accuracy is not the one to compare).
Used for experiments/README.md's "advice that works".
"""

import argparse
from pathlib import Path

from benchmarks.arguments import run_directory_with
from grpo_exp.answers import BUILT_IN, normalise_answer
from grpo_exp.measures import paired_change, wilson_interval
from grpo_exp.run_files import read_jsonl


def outcomes(run_dir: Path, when: str, rule: str | None) -> dict[str, float]:
    """Each held-out question's outcome (1/0; unjudged left out), relabelled by `rule` when given."""
    result = {}
    for sample in read_jsonl(run_dir / f"eval_{when}.jsonl"):
        if rule is not None:
            answer = BUILT_IN[rule](sample["completion"])
            label = answer is not None and normalise_answer(answer) == normalise_answer(str(sample["solution"]))
        elif sample.get("environment") is not None:
            label = bool(sample.get("env_success"))
        elif sample.get("correct") is None:
            continue
        else:
            label = bool(sample["correct"])
        result[sample["question"]] = float(label)
    return result


def rate(values: list[float]) -> str:
    low, high = wilson_interval(round(sum(values)), len(values))
    return f"{sum(values) / len(values):.3f} [{low:.3f}, {high:.3f}]"


def change(first: dict[str, float], second: dict[str, float]) -> str:
    keys = [k for k in first if k in second]
    mean, low, high = paired_change([first[k] for k in keys], [second[k] for k in keys])
    return f"{mean:+.3f} (paired 95% [{low:+.3f}, {high:+.3f}], {len(keys)} problems)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.advice_change")
    run_directory = run_directory_with("eval_before.jsonl", "eval_after.jsonl")
    parser.add_argument("failed", type=run_directory)
    parser.add_argument("advised", type=run_directory)
    parser.add_argument("--answer", choices=sorted(BUILT_IN), help="relabel both runs' answers with this rule")
    args = parser.parse_args(argv)
    after = {}
    for name, run_dir in (("failed", args.failed), ("advised", args.advised)):
        before, after[name] = outcomes(run_dir, "before", args.answer), outcomes(run_dir, "after", args.answer)
        print(
            f"{name} ({run_dir.name}): before {rate(list(before.values()))}, after {rate(list(after[name].values()))}, "
            f"change {change(before, after[name])}"
        )
    print(f"advised after - failed after: {change(after['failed'], after['advised'])}")


if __name__ == "__main__":
    main()
