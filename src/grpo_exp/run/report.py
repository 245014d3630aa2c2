"""The end-of-run summary: a pure function from what happened to a dict, and its printed form."""

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grpo_exp.analysis.diagnosis import Finding, diagnosis_lines
from grpo_exp.measures import quarter_means
from grpo_exp.run.tracking import read_metrics


def reward_trend(metrics: list[dict], key: str = "reward") -> tuple[float, float]:
    """Mean training reward over the first and the last quarter of the logged steps."""
    return quarter_means([m[key] for m in metrics if key in m and isinstance(m[key], int | float)])


def build_summary(
    cfg,
    name: str,
    model: str,
    sizes: tuple[int, int],
    steps: int,
    train_seconds: float,
    paths: dict,
    wandb_sync: str | None,
) -> dict:
    """What was trained, how it went, and where everything is: summary.json, W&B summary, printed table."""
    components = cfg.reward.components
    reward_first, reward_last = reward_trend(read_metrics(paths["metrics"]))
    return {
        "name": name,
        "model": model,
        "dataset": cfg.dataset.name,
        "train_size": sizes[0],
        "eval_size": sizes[1],
        "reward": " + ".join(f"{components[n].weight:g}*{n}" for n in components),
        "steps": steps,
        "prompts_per_step": cfg.trainer.prompts_per_step,
        "num_generations": cfg.trainer.num_generations,
        "algorithm": cfg.algorithm.name,  # the advantage estimator (conf/algorithm)
        "beta": cfg.trainer.beta,
        "learning_rate": cfg.trainer.learning_rate,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / max(steps, 1),
        "reward_first": reward_first,
        "reward_last": reward_last,
        **paths,
        "wandb_sync": wandb_sync,
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 120))
    table = Table(title=f"grpo_exp run: {summary['name']}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("model", summary["model"])
    table.add_row("dataset", f"{summary['dataset']} ({summary['train_size']} train / {summary['eval_size']} held out)")
    table.add_row("reward", summary["reward"])
    table.add_row(
        "training",
        f"{summary['steps']} steps x {summary['prompts_per_step']} prompts x G={summary['num_generations']}, "
        f"{summary.get('algorithm', 'grpo')}, beta={summary['beta']}, lr={summary['learning_rate']:g}, "
        f"{summary['train_seconds']:.0f} s "
        f"({summary['seconds_per_step']:.1f} s/step)",
    )
    table.add_row(
        "train reward",
        f"{_fmt(summary['reward_first'])} -> {_fmt(summary['reward_last'])} (first vs last quarter of steps)",
    )
    before, after = summary.get("heldout_accuracy_before"), summary.get("heldout_accuracy_after")
    judged = f"labels {summary['labels']}, answers read by {summary['answer']}" if "answer" in summary else ""
    if summary.get("scored_by"):  # environments: episodes won, scored by the environment itself
        won = (summary.get(f"heldout_environment_success_{when}") for when in ("before", "after"))
        before, after, judged = *won, f"scored by {summary['scored_by']}"
    name, what = (
        ("held-out episodes won", "episodes") if summary.get("scored_by") else ("held-out accuracy", "problems")
    )
    ends = f"{_fmt(before)} -> {_fmt(after)}"
    if "warmup_source" in summary:
        table.add_row("warm-up", warmup_line(summary))
        won = "environment_success" if summary.get("scored_by") else "accuracy"
        warmed = _fmt(summary.get(f"heldout_{won}_before_warmup"))
        ends = f"{warmed} -> (warm-up) {_fmt(before)} -> (GRPO) {_fmt(after)}"
    table.add_row(name, f"{ends} (greedy, {summary['eval_size']} {what}{', ' if judged else ''}{judged})")
    if summary.get("heldout_tasks"):
        shown = []
        for task in summary["heldout_tasks"]:
            before, after = (_fmt(summary.get(f"heldout_accuracy_{task}_{when}")) for when in ("before", "after"))
            constant = _fmt(summary.get(f"heldout_constant_{task}_after"))
            distinct = _fmt(summary.get(f"heldout_distinct_{task}_after"), 2)
            shown.append(f"{task} {before} -> {after} (one constant answer: {constant}; distinct answers: {distinct})")
        table.add_row("held-out by task", "\n".join(shown))
    if "heldout_gain_format" in summary:
        lenient = (_fmt(summary[f"heldout_lenient_accuracy_{when}"]) for when in ("before", "after"))
        table.add_row(
            "held-out gain",
            f"format {summary['heldout_gain_format']:+.2f}, content {summary['heldout_gain_content']:+.2f} (content: "
            "the reference anywhere in the final sentence, {} -> {})".format(*lenient),
        )
    if "heldout_verify_accuracy_before" in summary or "heldout_verify_accuracy_after" in summary:
        parts = []
        for label, key in (("verdict accuracy", "accuracy"), ("P(Yes) AUROC", "p_yes_auroc")):
            before, after = (summary.get(f"heldout_verify_{key}_{when}") for when in ("before", "after"))
            parts.append(f"{label} {_fmt(before)} -> {_fmt(after)}")
        shares = (_fmt(summary.get(f"heldout_verify_yes_share_{when}"), 2) for when in ("before", "after"))
        note = " (held-out, the policy's own answers; share of correct ones {} -> {})".format(*shares)
        table.add_row("self-verification", ", ".join(parts) + note)
    if summary.get("entropy_first") is not None:
        health = (
            f"entropy {_fmt(summary['entropy_first'])} -> {_fmt(summary['entropy_last'])} nats a token, "
            f"{_fmt(summary['clipped_ratio_last'], 2)} of the last steps' completions cut at the length limit"
        )
        keys = ("entropy_alarm", "truncation_warning", "no_signal_warning", "answer_collapse_alarm", "alarm")
        fired = [summary[key] for key in keys if summary.get(key)]
        table.add_row("policy health", "\n".join([health, *fired]))
    if summary.get("labels_check") is not None:
        table.add_row("labels check", "\n".join(summary["labels_check"]) or "the labels and the content check agree")
    if summary.get("probe_findings") is not None:
        findings = summary["probe_findings"]
        table.add_row("reward probe", "\n".join(findings) or "no attack paid beyond a wrong answer")
    if summary.get("diagnosis") is not None:
        table.add_row("diagnosis", "\n".join(diagnosis_lines([Finding(**f) for f in summary["diagnosis"]])))
    for key in ("run_dir", "config", "metrics", "log", "checkpoint", "wandb"):
        if summary.get(key):
            table.add_row(key.replace("_", " "), str(summary[key]))
    if summary.get("wandb_sync"):
        table.add_row("sync to W&B", summary["wandb_sync"])
    console.print(table)


def warmup_line(summary: dict) -> str:
    """The warm-up stage in one line: its demonstrations, where they came from, its steps and loss."""
    played = summary.get("warmup_played")
    source = summary["warmup_source"]
    kept = (
        f"kept of {played} episodes played (mean reward {_fmt(summary.get('warmup_played_mean_reward'))})"
        if played is not None
        else "the user's conversations"
    )
    return (
        f"{summary['warmup_demonstrations']} demonstrations from {source}, {kept}; {summary['warmup_steps']} SFT "
        f"steps, loss {_fmt(summary.get('warmup_loss_first'))} -> {_fmt(summary.get('warmup_loss_last'))}, "
        f"{summary.get('warmup_seconds') or 0:.0f} s"
    )


def write_summary(summary: dict, path: Path) -> None:
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
