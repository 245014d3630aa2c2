"""What a CPU run learns: `python -m benchmarks.learning_curve <multirun dir over seeds> [--out PNG]`.

Reads the runs of a seed sweep (e.g. `python -m grpo_exp.train -m +experiment=learning_curve
trainer.seed=1,2,3`), prints held-out accuracy before and after training per seed with their mean and
spread, the wall time, and draws the figure: training reward per step (each seed, and their mean) and
held-out accuracy before/after (each seed, and the mean with its standard deviation).
"""

import argparse
import statistics
from pathlib import Path

from benchmarks.arguments import existing_directory
from grpo_exp.analysis.comparison import discover_runs


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {sd:.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning_curve")
    parser.add_argument("sweep", type=existing_directory)
    parser.add_argument("--out", type=Path, help="the PNG (default: <sweep>/learning_curve.png)")
    args = parser.parse_args(argv)
    runs = [run for run in discover_runs([args.sweep]) if run.summary]
    if not runs:
        raise SystemExit(f"no finished runs under {args.sweep}")
    before = [run.summary["heldout_accuracy_before"] for run in runs]
    after = [run.summary["heldout_accuracy_after"] for run in runs]
    gains = [b - a for a, b in zip(before, after, strict=True)]
    minutes = [run.summary["train_seconds"] / 60 for run in runs]
    first = runs[0].summary
    shape = f"{first['steps']} steps x {first['prompts_per_step']} prompts x G={first['num_generations']}"
    print(f"{len(runs)} seeds, {shape}, lr={first['learning_rate']:g}, {first['eval_size']} held-out problems")
    for run, b, a in zip(runs, before, after, strict=True):
        seed = run.overrides.get("trainer.seed", "?")
        print(f"  seed {seed}: held-out {b:.3f} -> {a:.3f} ({a - b:+.3f}), {run.summary['train_seconds'] / 60:.1f} min")
    print(f"held-out accuracy before: {spread(before)}")
    print(f"held-out accuracy after:  {spread(after)}")
    print(f"gain:                     {spread(gains)}")
    print(f"training time: {spread(minutes)} minutes per run")
    plot(runs, before, after, args.out or args.sweep / "learning_curve.png")


def plot(runs, before: list[float], after: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, bars) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    series = []
    for run in runs:
        points = [(m["step"], m["reward"]) for m in run.metrics if isinstance(m.get("reward"), int | float)]
        steps, rewards = zip(*points, strict=True)
        series.append(rewards)
        curve.plot(steps, rewards, alpha=0.35, label=f"seed {run.overrides.get('trainer.seed', '?')}")
    length = min(len(s) for s in series)
    mean = [statistics.mean(s[i] for s in series) for i in range(length)]
    curve.plot(range(1, length + 1), mean, color="black", linewidth=2, label="mean")
    curve.set_xlabel("training step")
    curve.set_ylabel("training reward (weighted)")
    curve.grid(alpha=0.3)
    curve.legend(fontsize=8)
    for b, a in zip(before, after, strict=True):
        bars.plot([0, 1], [b, a], color="grey", alpha=0.5, marker="o")
    bars.errorbar(
        [0, 1],
        [statistics.mean(before), statistics.mean(after)],
        yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in (before, after)],
        color="black",
        linewidth=2,
        capsize=6,
        marker="s",
        label="mean +- sd",
    )
    bars.set_xticks([0, 1], ["before", "after"])
    bars.set_xlim(-0.4, 1.4)
    bars.set_ylabel("held-out accuracy (greedy)")
    bars.grid(alpha=0.3)
    bars.legend(fontsize=8)
    fig.suptitle(f"{len(runs)} seeds: training reward and held-out accuracy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
