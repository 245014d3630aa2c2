"""Comparing runs side by side: load run directories (or a W&B group), tabulate, plot."""

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grpo_exp.analysis.diagnosis import diagnose, read_run
from grpo_exp.measures import mean_interval, paired_differences, quarter_means
from grpo_exp.run_files import HELDOUT_ACCURACY as HELDOUT
from grpo_exp.run_files import (
    METRICS_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    read_json,
    read_metrics,
    read_yaml,
    step_seconds,
)

CURVES = ["reward", "groups/pass@1", "groups/reward/frac_zero_std", "kl", "advantages/mean_abs", "entropy"]
SEED = "trainer.seed"
UNREADABLE = "unreadable"  # a run's status where one of its files is damaged (load_run)
# The comparison table's columns that are a run's results (numbers), as opposed to its settings: the columns
# averaged over seeds and compared between settings.
RESULTS = [
    "steps",
    "final reward",
    "best reward",
    "held-out before",
    "held-out after",
    "best held-out",
    "pass@k",
    "final kl",
    "s/step",
    "train s",
]
WARMUP_RESULTS = ["after warm-up", "warm-up s"]  # where a run compared had a warm-up stage (warmup=sft)


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
    """A run directory's records. One with a damaged file is a run whose status is `unreadable`, with the file and
    why, so that the others are still compared (a last line cut short by a stop is no damage: read_jsonl)."""
    run = Run(directory.as_posix(), {})
    try:
        run.overrides = _parse_overrides(_read_overrides(directory / ".hydra" / "overrides.yaml"))
        run.summary = read_json(directory / SUMMARY_FILE)
        run.status = read_json(directory / STATUS_FILE)
        run.metrics = read_metrics(directory / METRICS_FILE)
    except (OSError, ValueError) as err:
        run.summary, run.metrics, run.status = {}, [], {"status": UNREADABLE, "error": str(err)}
    return run


def _read_overrides(path: Path) -> list[str]:
    overrides = read_yaml(path) or []
    if not isinstance(overrides, list):
        raise ValueError(f"{path}: not a list of overrides")
    return [str(item) for item in overrides]


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


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def _series(run: Run, key: str) -> list[tuple[int, float]]:
    return [(m.get("step", 0), m[key]) for m in run.metrics if _is_number(m.get(key))]


def _largest_pass_key(run: Run) -> str | None:
    ks = [int(k.split("@")[1]) for m in run.metrics for k in m if k.startswith("groups/pass@")]
    return f"groups/pass@{max(ks)}" if ks else None


def reward_components(runs: list[Run]) -> list[str]:
    """The reward components TRL logged (rewards/<name>/mean) in any of the runs, in the order first seen."""
    keys = (key for run in runs for m in run.metrics for key in m)
    names = (key.split("/")[1] for key in keys if key.startswith("rewards/") and key.endswith("/mean"))
    return list(dict.fromkeys(names))


def result_columns(rows: list[dict]) -> list[str]:
    """RESULTS, and each reward component's column (the totals of runs with different weights are not comparable;
    their components are)."""
    first = rows[0] if rows else {}
    warmed = [column for column in WARMUP_RESULTS if column in first]
    return RESULTS + warmed + [column for column in first if column.startswith("reward/")]


def comparison_rows(runs: list[Run], swept: list[str]) -> list[dict]:
    rows = []
    components = reward_components(runs)
    warmed = any("warmup_source" in run.summary for run in runs)
    for run in runs:
        rewards = [v for _, v in _series(run, "reward")]
        pass_key = _largest_pass_key(run)
        kl = [v for _, v in _series(run, "kl")]
        step_times = [seconds for m in run.metrics if _is_number(seconds := step_seconds(m))]
        row = {"run": Path(run.name).name}
        row |= {key: run.overrides.get(key, "(default)") for key in swept}
        row |= {
            "status": run.state,
            "steps": max((m.get("step", 0) for m in run.metrics), default=0),
            "final reward": quarter_means(rewards)[1],
            "best reward": max(rewards) if rewards else math.nan,
            "held-out before": untrained_accuracy(run.summary),
            "held-out after": run.summary.get("heldout_accuracy_after"),
            "best held-out": run.summary.get("best_heldout_accuracy"),  # eval.every's best validation
            "pass@k": quarter_means([v for _, v in _series(run, pass_key)])[1] if pass_key else math.nan,
            "k": int(pass_key.split("@")[1]) if pass_key else None,
            "final kl": kl[-1] if kl else math.nan,
            "s/step": sum(step_times) / len(step_times) if step_times else math.nan,
            "train s": run.summary.get("train_seconds"),
            "findings": findings_of(run),
        }
        if warmed:  # warm-up + GRPO beside GRPO alone: what the warm-up gave, and its time
            warm_up = "warmup_source" in run.summary
            row["after warm-up"] = run.summary.get("heldout_accuracy_before") if warm_up else None
            row["warm-up s"] = run.summary.get("warmup_seconds") if warm_up else None
        # each component's final reward, unweighted: the last quarter's mean, as for the total
        row |= {f"reward/{n}": quarter_means([v for _, v in _series(run, f"rewards/{n}/mean")])[1] for n in components}
        rows.append(row)
    return rows


def untrained_accuracy(summary: dict) -> float | None:
    """The held-out accuracy of the model as loaded: before the warm-up where the run had one (warmup=sft)."""
    return summary.get("heldout_accuracy_before_warmup", summary.get("heldout_accuracy_before"))


def findings_of(run: Run) -> str:
    """The run's findings by name (grpo_exp.analysis.diagnosis): its summary's, else read from its directory (a run made
    before the findings existed); `grpo-exp diagnose <run dir>` says each in full."""
    if run.summary.get("diagnosis") is not None:
        names = [finding["name"] for finding in run.summary["diagnosis"]]
    elif Path(run.name).is_dir() and run.state != UNREADABLE:
        names = [finding.name for finding in diagnose(read_run(Path(run.name)))]
    else:
        return "-"
    return ", ".join(names) or "none"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict], console: Console | None = None, title: str = "grpo_exp runs") -> None:
    if not rows:
        return
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    (console or Console(width=160)).print(table)


def print_failures(runs: list[Run], console: Console | None = None) -> None:
    for run in runs:
        if run.state in ("failed", UNREADABLE):
            (console or Console(width=160)).print(f"[red]{run.state}[/red] {run.name}: {run.status.get('error', '?')}")


def write_tables(rows: list[dict], out_dir: Path, name: str = "comparison") -> list[Path]:
    """<name>.csv and <name>.md (nothing for no rows)."""
    if not rows:
        return []
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_curves(runs: list[Run], swept: list[str], out_dir: Path) -> list[Path]:
    """One PNG per main curve, a line per run, coloured by the swept parameters."""
    plt = _pyplot()
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
        written.append(_save(fig, out_dir / f"{key.replace('/', '_').replace('@', '_at_')}.png"))
    return written


def wandb_group(path: str) -> tuple[str, str, str]:
    """(entity, project, group) of `--wandb ENTITY/PROJECT/GROUP`; any other shape is a ValueError saying so."""
    parts = path.split("/", 2)
    if len(parts) != 3 or not all(part.strip() for part in parts):
        raise ValueError(f"{path!r} is not ENTITY/PROJECT/GROUP (three names, e.g. my-team/grpo/sweep-1)")
    return parts[0], parts[1], parts[2]


def runs_from_wandb(path: str) -> list[Run]:
    """Runs of one W&B group (ENTITY/PROJECT/GROUP), via the W&B API (needs network and an API key)."""
    import wandb

    entity, project, group = wandb_group(path)
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


# ---- across seeds: the runs that differ only in trainer.seed form a setting -------------------------------------


@dataclass
class Setting:
    values: dict[str, str]  # its values of the swept keys other than trainer.seed
    runs: list[Run] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # the runs' rows of the comparison table

    @property
    def name(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.values.items()) or "all runs"

    @property
    def seeds(self) -> list[str]:
        return [run.overrides.get(SEED, "(default)") for run in self.runs]

    def results(self, column: str) -> dict[str, float]:
        """seed -> that run's value in the column; runs without one are left out. Keyed by seed for the pairing
        (a seed run twice in a setting counts once: its last run)."""
        return {seed: row[column] for seed, row in zip(self.seeds, self.rows, strict=True) if _is_number(row[column])}


def settings(runs: list[Run], rows: list[dict], swept: list[str]) -> list[Setting]:
    """The finished runs (and their rows) grouped by their overrides without trainer.seed, in the order they first
    appear; a failed or unfinished run's numbers are partial, so they are left out. Runs with the same overrides agree
    on every key but the seed, so the swept keys alone tell settings apart."""
    keys = [key for key in swept if key != SEED]
    grouped: dict[tuple, Setting] = {}
    for run, row in zip(runs, rows, strict=True):
        if run.state != "finished":
            continue
        values = {key: run.overrides.get(key, "(default)") for key in keys}
        setting = grouped.setdefault(tuple(values.items()), Setting(values))
        setting.runs.append(run)
        setting.rows.append(row)
    return list(grouped.values())


class UnknownSetting(ValueError):
    """A baseline that names none of the settings."""


def pick_baseline(candidates: list[Setting], choice: str | None) -> Setting | None:
    """The setting named by `choice` (its key=value pairs, comma-separated, in any order); without one, the first
    (None when there is none). UnknownSetting, naming the settings there are when none matches."""
    if choice is None:
        return candidates[0] if candidates else None
    wanted = _parse_overrides(choice.split(","))
    for setting in candidates:
        if setting.values == wanted:
            return setting
    names = " | ".join(setting.name for setting in candidates) or "none (no finished runs)"
    raise UnknownSetting(f"{choice!r} is none of the settings: {names}")


def _estimate(label: str, values: list[float], unit: str) -> dict:
    """The mean of values (under `label`) and its 95% interval as table columns; the note says why one is missing."""
    mean, low, high = mean_interval(values)
    note = {0: f"no {unit}s", 1: f"1 {unit}: no interval"}.get(len(values), "")
    return {label: mean, "95% low": low, "95% high": high, "note": note}


def seed_means(groups: list[Setting], columns: list[str] = RESULTS) -> list[dict]:
    """A row per setting and result: the mean over its seeds and the 95% Student-t interval."""
    table = []
    for setting in groups:
        for column in columns:
            values = list(setting.results(column).values())
            if values:  # a result no run of the setting has (best held-out without eval.every): no row
                table.append(
                    {"setting": setting.name, "result": column, "seeds": len(values)}
                    | _estimate("mean", values, "seed")
                )
    return table


def paired_table(groups: list[Setting], baseline: Setting, columns: list[str] = RESULTS) -> list[dict]:
    """A row per other setting and result: its difference from the baseline, seed by seed (the same seed in both:
    the seed's own luck cancels), the mean difference and its 95% interval. Seeds with a value in one setting only
    are left out; the note names them."""
    table = []
    for setting in groups:
        if setting is baseline:
            continue
        for column in columns:
            theirs, mine = baseline.results(column), setting.results(column)
            if not theirs or not mine:
                continue
            differences = paired_differences(theirs, mine)
            row = {"setting": setting.name, "baseline": baseline.name, "result": column, "pairs": len(differences)}
            row |= _estimate("mean difference", differences, "pair")
            unpaired = [seed for seed in {**theirs, **mine} if (seed in theirs) != (seed in mine)]
            if unpaired:
                left_out = f"left out, in one setting only: seed {', '.join(unpaired)}"
                row["note"] = "; ".join(filter(None, [row["note"], left_out]))
            table.append(row)
    return table


def _mean_band(series: list[list[tuple[int, float]]]) -> tuple[list, list, list, list]:
    """Steps, and at each the mean over the series with a value there and its 95% interval (low, high)."""
    by_step: dict[int, list[float]] = {}
    for points in series:
        for step, value in points:
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    estimates = [mean_interval(by_step[step]) for step in steps]
    return steps, [e[0] for e in estimates], [e[1] for e in estimates], [e[2] for e in estimates]


def _before_after(run: Run) -> list[tuple[int, float]]:
    """Held-out accuracy before training (at step 0) and after it (at its last step), where measured."""
    last = run.summary.get("steps") or max((m["step"] for m in run.metrics), default=0)
    points = [(0, run.summary.get("heldout_accuracy_before")), (last, run.summary.get("heldout_accuracy_after"))]
    return [(step, value) for step, value in points if _is_number(value)]


def side_by_side(index: int, settings: int, last_step: int) -> float:
    """How far setting `index` of `settings` draws its before/after squares from their step: side by side, 1% of
    the run's length apart, centred on the step (every setting ends at the same step; drawn there, they hide each
    other)."""
    return (index - (settings - 1) / 2) * max(last_step, 1) * 0.01


def plot_heldout(groups: list[Setting], out_dir: Path) -> list[Path]:
    """heldout_by_setting.png: held-out accuracy over training per setting, the mean over seeds with its 95%
    interval: the eval.every validations as a line and band, before and after training as squares with bars
    (apart: they are measured on all held-out problems, validations on eval.every_problems)."""
    validations = [[_series(run, HELDOUT) for run in setting.runs] for setting in groups]
    ends = [[_before_after(run) for run in setting.runs] for setting in groups]
    validated = any(points for series in validations for points in series)
    end_steps = sorted({step for series in ends for points in series for step, _ in points})
    if not validated and not end_steps:
        return []
    plt = _pyplot()
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7, 4))
    for index, setting in enumerate(groups):
        colour = colours(index % 10)
        seeds = len(set(setting.seeds))
        steps, mean, low, high = _mean_band(validations[index])
        tag = f"{seeds} seeds" if seeds > 1 else "1 seed: no interval"
        ax.plot(steps, mean, marker="o", markersize=3, color=colour, label=f"{setting.name} ({tag})")
        ax.fill_between(steps, low, high, color=colour, alpha=0.2)
        steps, mean, low, _ = _mean_band(ends[index])
        shift = side_by_side(index, len(groups), end_steps[-1] if end_steps else 0)
        ax.errorbar(
            [step + shift for step in steps],
            mean,
            yerr=[m - lo for m, lo in zip(mean, low, strict=True)],
            fmt="s",
            capsize=3,
            color=colour,
        )
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps
    if not validated:  # before/after only: ticks at those steps
        ax.set_xticks(end_steps)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(
        "held-out accuracy: mean over seeds, 95% Student-t interval (band, bars)\nsquares: before and after training",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [_save(fig, out_dir / "heldout_by_setting.png")]


@dataclass
class Comparison:
    rows: list[dict]  # a row per run
    means: list[dict]  # a row per setting and result: the mean over seeds
    paired: list[dict]  # a row per other setting and result: the paired difference from the baseline
    baseline: Setting | None  # None: no finished runs
    written: list[Path]
    one_seed: bool = False  # every setting has one seed: no interval anywhere (said once, not per row)


def compare_runs(runs: list[Run], out_dir: Path, baseline: str | None = None) -> Comparison:
    """The table of the runs, the settings' means over seeds and their paired differences from the baseline
    (written as CSV and Markdown), and the plots. UnknownSetting, before anything is written, for a bad baseline."""
    swept = swept_parameters(runs)
    rows = comparison_rows(runs, swept)
    groups = settings(runs, rows, swept)
    reference = pick_baseline(groups, baseline)
    columns = result_columns(rows)
    means, paired = seed_means(groups, columns), paired_table(groups, reference, columns) if reference else []
    one_seed = bool(means) and all(row["seeds"] == 1 for row in means)
    if one_seed:
        means, paired = without_intervals(means), without_intervals(paired)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        *write_tables(rows, out_dir),
        *write_tables(means, out_dir, "settings"),
        *write_tables(paired, out_dir, "paired"),
        *plot_curves(runs, swept, out_dir),
        *plot_heldout(groups, out_dir),
    ]
    return Comparison(rows, means, paired, reference, written, one_seed)


def without_intervals(table: list[dict]) -> list[dict]:
    """The table without its interval columns (and their notes), where no row can have one."""
    dropped = ("95% low", "95% high", "note", "seeds", "pairs")
    return [{key: value for key, value in row.items() if key not in dropped} for row in table]


def compare(runs: list[Run], out_dir: Path) -> tuple[list[dict], list[Path]]:
    """compare_runs' table and files (the baseline: the first setting)."""
    result = compare_runs(runs, out_dir)
    return result.rows, result.written
