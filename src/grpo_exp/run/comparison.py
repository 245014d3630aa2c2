"""Comparing runs side by side: load run directories (or a W&B group), tabulate, plot."""

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from grpo_exp.run.files import METRICS_FILE, STATUS_FILE
from grpo_exp.run.report import quarter_means
from grpo_exp.run.tracking import read_metrics

CURVES = ["reward", "groups/pass@1", "groups/reward/frac_zero_std", "kl", "advantages/mean_abs", "entropy"]


@dataclass
class Run:
    name: str
    overrides: dict[str, str]
    metrics: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)  # from a sweep's job_status.json: finished / failed (+ error)

    @property
    def state(self) -> str:
        return self.status.get("status") or ("finished" if self.summary else "incomplete")


def _parse_overrides(items: list[str]) -> dict[str, str]:
    pairs = (item.lstrip("+~").split("=", 1) for item in items if "=" in item)
    return {key: value for key, value in pairs if not key.startswith("hydra.")}


def load_run(directory: Path) -> Run:
    overrides_file = directory / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    summary_file = directory / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    status_file = directory / STATUS_FILE
    status = json.loads(status_file.read_text()) if status_file.is_file() else {}
    metrics = read_metrics(directory / METRICS_FILE)
    return Run(directory.as_posix(), _parse_overrides(overrides or []), metrics, summary, status)


def _is_run(directory: Path) -> bool:
    return (directory / METRICS_FILE).is_file() or (directory / STATUS_FILE).is_file()


def discover_runs(paths: list[Path]) -> list[Run]:
    """Run directories (with a metrics file, or a sweep job's status) among the paths and below, in a stable order."""
    found: list[Path] = []
    for path in paths:
        if _is_run(path):
            found.append(path)
        else:
            marks = [*path.rglob(METRICS_FILE), *path.rglob(STATUS_FILE)]
            found += sorted({p.parent for p in marks if "wandb" not in p.parts}, key=_job_order)
    return [load_run(p) for p in dict.fromkeys(found)]


def _job_order(directory: Path) -> tuple:
    """Sweep jobs (numbered directories) in numeric order: 2 before 10."""
    return (directory.parent.as_posix(), int(directory.name) if directory.name.isdigit() else 0, directory.name)


def swept_parameters(runs: list[Run]) -> list[str]:
    """The override keys whose values differ between the runs."""
    keys = sorted({key for run in runs for key in run.overrides})
    return [k for k in keys if len({run.overrides.get(k, "(default)") for run in runs}) > 1]


def _series(run: Run, key: str) -> list[tuple[int, float]]:
    return [(m["step"], m[key]) for m in run.metrics if isinstance(m.get(key), int | float) and not math.isnan(m[key])]


def _largest_pass_key(run: Run) -> str | None:
    ks = [int(k.split("@")[1]) for m in run.metrics for k in m if k.startswith("groups/pass@")]
    return f"groups/pass@{max(ks)}" if ks else None


def comparison_rows(runs: list[Run], swept: list[str]) -> list[dict]:
    rows = []
    for run in runs:
        rewards = [v for _, v in _series(run, "reward")]
        pass_key = _largest_pass_key(run)
        kl = [v for _, v in _series(run, "kl")]
        step_times = [v for _, v in _series(run, "step_time")]
        row = {"run": Path(run.name).name}
        row |= {key: run.overrides.get(key, "(default)") for key in swept}
        row |= {
            "status": run.state,
            "steps": max((m["step"] for m in run.metrics), default=0),
            "final reward": quarter_means(rewards)[1],
            "best reward": max(rewards) if rewards else math.nan,
            "held-out before": run.summary.get("heldout_accuracy_before"),
            "held-out after": run.summary.get("heldout_accuracy_after"),
            "pass@k": quarter_means([v for _, v in _series(run, pass_key)])[1] if pass_key else math.nan,
            "k": int(pass_key.split("@")[1]) if pass_key else None,
            "final kl": kl[-1] if kl else math.nan,
            "s/step": sum(step_times) / len(step_times) if step_times else math.nan,
        }
        rows.append(row)
    return rows


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict], console: Console | None = None, title: str = "grpo_exp runs") -> None:
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    (console or Console(width=160)).print(table)


def print_failures(runs: list[Run], console: Console | None = None) -> None:
    for run in runs:
        if run.state == "failed":
            (console or Console(width=160)).print(f"[red]failed[/red] {run.name}: {run.status.get('error', '?')}")


def write_tables(rows: list[dict], out_dir: Path) -> list[Path]:
    csv_path, md_path = out_dir / "comparison.csv", out_dir / "comparison.md"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(_cell(v) for v in row.values()) + " |" for row in rows]
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [csv_path, md_path]


def label(run: Run, swept: list[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={run.overrides.get(k, '(default)')}" for k in swept) or Path(run.name).name


def plot_curves(runs: list[Run], swept: list[str], out_dir: Path) -> list[Path]:
    """One PNG per main curve, a line per run, coloured by the swept parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("viridis")
    written = []
    for key in CURVES:
        if not any(_series(run, key) for run in runs):
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for index, run in enumerate(runs):
            points = _series(run, key)
            if points:
                steps, values = zip(*points, strict=True)
                colour = colours(index / max(1, len(runs) - 1))
                ax.plot(steps, values, marker="o", markersize=3, color=colour, label=label(run, swept))
        ax.set_xlabel("training step")
        ax.set_ylabel(key)
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        path = out_dir / f"{key.replace('/', '_').replace('@', '_at_')}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def runs_from_wandb(path: str) -> list[Run]:
    """Runs of one W&B group (ENTITY/PROJECT/GROUP), via the W&B API (needs network and an API key)."""
    import wandb

    entity, project, group = path.split("/", 2)
    runs = []
    for run in wandb.Api().runs(f"{entity}/{project}", filters={"group": group}):
        # HF's W&B callback logs "train/<key>" against "train/global_step".
        history = [
            {"step": row.get("train/global_step"), **{k.removeprefix("train/"): v for k, v in row.items()}}
            for row in run.scan_history()
            if row.get("train/global_step") is not None
        ]
        overrides = _parse_overrides(run.name.split(",")) if run.name != "defaults" else {}
        runs.append(Run(run.name, overrides, history, dict(run.summary)))
    return runs


def compare(runs: list[Run], out_dir: Path) -> tuple[list[dict], list[Path]]:
    swept = swept_parameters(runs)
    rows = comparison_rows(runs, swept)
    out_dir.mkdir(parents=True, exist_ok=True)
    return rows, write_tables(rows, out_dir) + plot_curves(runs, swept, out_dir)
