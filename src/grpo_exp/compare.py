"""`python -m grpo_exp.compare <multirun dir | run dirs...>`: compare runs side by side.

Prints a table (the swept parameters as columns; final and best reward, held-out accuracy, pass@k, KL,
step time), writes it as CSV and Markdown, and plots the main curves coloured by the swept parameters
(PNG). Reads the run directories grpo_exp writes (no W&B needed); with `--wandb ENTITY/PROJECT/GROUP`
and network access, reads the same from the W&B API instead.
"""

import argparse
import sys
from pathlib import Path

from grpo_exp.run.comparison import compare, discover_runs, print_failures, print_table, runs_from_wandb
from grpo_exp.run.files import METRICS_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_exp.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="a multirun directory, or run directories")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT/GROUP", help="read the runs of a W&B group instead")
    parser.add_argument("--out", type=Path, help="where the tables and plots go (default: <first path>/compare)")
    args = parser.parse_args(argv)
    if not args.paths and not args.wandb:
        parser.error("give a multirun directory, run directories, or --wandb ENTITY/PROJECT/GROUP")
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such directory: {', '.join(map(str, missing))}")
    runs = runs_from_wandb(args.wandb) if args.wandb else discover_runs(args.paths)
    if not runs:
        parser.error(f"no grpo_exp runs (directories with {METRICS_FILE}) under {', '.join(map(str, args.paths))}")
    out_dir = args.out or (args.paths[0] / "compare" if args.paths else Path("compare"))
    rows, written = compare(runs, out_dir)
    print_table(rows)
    print_failures(runs)
    print(f"Wrote {len(written)} files to {out_dir}: " + ", ".join(p.name for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
