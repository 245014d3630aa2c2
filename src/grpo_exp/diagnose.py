"""`grpo-exp diagnose <run dir> [...]`: why a run did (not) learn, from its own records.

Reads what a run directory holds (metrics.jsonl, summary.json, eval_before/after.jsonl, probe.json, config.yaml),
runs made before this command existed included, and prints each finding: what was seen (with its interval), why it
matters, and the settings to try as overrides. A multirun directory: every run under it. --json: the findings as
JSON.
"""

import argparse
import json
import sys
from pathlib import Path

from grpo_exp.analysis.diagnosis import diagnose, diagnosis_lines, is_run_dir, read_run
from grpo_exp.errors import run_command
from grpo_exp.process_exit import run_then_exit
from grpo_exp.run_files import not_directories


def run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories given, or found under them (a multirun directory), in order."""
    found = []
    for path in paths:
        if is_run_dir(path):
            found.append(path)
        else:
            found += sorted(
                {p.parent for p in path.rglob("metrics.jsonl")} | {p.parent for p in path.rglob("summary.json")}
            )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-exp diagnose", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, or a multirun directory")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    if problem := not_directories(args.paths):
        parser.error(problem)
    directories = run_dirs(args.paths)
    if not directories:
        parser.error(
            f"no grpo_exp run (a directory with metrics.jsonl or summary.json) under {', '.join(map(str, args.paths))}"
        )
    results, unread = {}, 0
    for directory in directories:
        try:
            results[directory] = diagnose(read_run(directory))
        except (OSError, ValueError) as err:  # a damaged file (named by the error): say so, go on with the others
            print(f"{directory}: cannot read its records: {err}", file=sys.stderr)
            unread += 1
    if args.json:
        print(json.dumps({str(d): [f.row() for f in found] for d, found in results.items()}, indent=2))
        return 1 if unread else 0
    for directory, found in results.items():
        print(f"{directory}:")
        print("\n".join(f"  {line}" for line in diagnosis_lines(found)))
    return 1 if unread else 0  # the others were read and printed


if __name__ == "__main__":
    run_then_exit(run_command, main)
