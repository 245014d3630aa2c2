"""`python -m grpo_exp.compare <multirun dir | run dirs...>`: compare runs side by side.

Prints a table (the swept parameters as columns; final and best reward, held-out accuracy, pass@k, KL,
step time), writes it as CSV and Markdown, and plots the main curves coloured by the swept parameters
(PNG). Reads the run directories grpo_exp writes (no W&B needed); with `--wandb ENTITY/PROJECT/GROUP`
and network access, reads the same from the W&B API instead.

Across seeds: finished runs that differ only in trainer.seed form a setting. Per setting and result, the mean over
seeds with its 95% Student-t interval (settings.csv/.md); per other setting, its difference from the baseline
setting (`--baseline`, default the first), paired by seed, with its mean and 95% interval (paired.csv/.md); the
held-out accuracy per setting over training (heldout_by_setting.png).
"""

import argparse
from pathlib import Path

from rich.console import Console

from grpo_exp.analysis.comparison import (
    Comparison,
    UnknownSetting,
    compare_runs,
    discover_runs,
    print_failures,
    print_table,
    runs_from_wandb,
    wandb_group,
)
from grpo_exp.errors import run_command
from grpo_exp.process_exit import run_then_exit
from grpo_exp.run_files import METRICS_FILE, not_directories, output_directory_problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_exp.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="a multirun directory, or run directories")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT/GROUP", help="read the runs of a W&B group instead")
    parser.add_argument("--out", type=Path, help="where the tables and plots go (default: <first path>/compare)")
    parser.add_argument(
        "--baseline",
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="the setting the others are compared with, seed by seed (default: the first), e.g. trainer.beta=0.0",
    )
    args = parser.parse_args(argv)
    if not args.paths and not args.wandb:
        parser.error("give a multirun directory, run directories, or --wandb ENTITY/PROJECT/GROUP")
    if problem := not_directories(args.paths):
        parser.error(problem)
    if args.wandb:
        try:
            wandb_group(args.wandb)
        except ValueError as err:
            parser.error(f"--wandb: {err}")
    out_dir = args.out or (args.paths[0] / "compare" if args.paths else Path("compare"))
    if problem := output_directory_problem(out_dir):  # before any run is read
        parser.error(f"{'--out ' if args.out else 'the output directory '}{out_dir}: {problem}")
    runs = runs_from_wandb(args.wandb) if args.wandb else discover_runs(args.paths)
    if not runs:
        parser.error(f"no grpo_exp runs (directories with {METRICS_FILE}) under {', '.join(map(str, args.paths))}")
    try:
        result = compare_runs(runs, out_dir, args.baseline)
    except UnknownSetting as err:  # nothing was written
        parser.error(f"--baseline: {err}")
    print_comparison(result)
    print_failures(runs)
    print(f"Wrote {len(result.written)} files to {out_dir}: " + ", ".join(p.name for p in result.written))
    return 0


def print_comparison(result: Comparison, console: Console | None = None) -> None:
    console = console or Console(width=160)
    print_table(result.rows, console)
    if result.one_seed:
        console.print("One seed per setting: no intervals (sweep trainer.seed too, e.g. trainer.seed=1,2,3, for them).")
        print_table(result.means, console, title="per setting (one seed)")
    else:
        print_table(result.means, console, title="mean over seeds per setting (95% Student-t interval)")
    if result.paired:
        interval = "one seed: no interval" if result.one_seed else "mean difference (95% Student-t interval)"
        title = f"paired by seed: setting - baseline ({result.baseline.name}), {interval}"
        print_table(result.paired, console, title=title)
    elif result.baseline:
        console.print(f"One setting ({result.baseline.name}): no paired differences.")


if __name__ == "__main__":
    run_then_exit(run_command, main)
