"""Real multiruns through the command line (tiny model): the G x beta preset, failures, launchers, Optuna."""

import csv
import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from grpo_exp.paths import CONF_DIR
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import STATUS_FILE
from support.config import TINY_RUN
from tests.helpers.cli import run_cli

QUICK = [*TINY_RUN, "eval.before=false"]


def job_dirs(sweep: Path) -> list[Path]:
    return sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def summary_of(job: Path) -> dict:
    return json.loads((job / "summary.json").read_text())


@pytest.mark.e2e
def test_the_group_size_by_beta_preset_runs_six_valid_jobs_in_one_wandb_group(tmp_path):
    result = run_cli(
        "-m",
        "+experiment=sweep_group_beta",
        *QUICK,
        "trainer.max_steps=1",
        "trainer.max_completion_length=16",  # the preset's 64 is for the embedded model; no answer is read here
        "eval.after=false",
        "logger=wandb",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 6
    seen = set()
    for job in jobs:
        summary = summary_of(job)
        group_size, beta = summary["num_generations"], summary["beta"]
        seen.add((group_size, beta))
        # The override reached TRL: its trainer ran groups of G, with the batch derived for that G...
        assert summary["trl_num_generations"] == group_size
        assert summary["per_device_train_batch_size"] == 2 * group_size
        # ...and the group statistics, computed from TRL's own batches, saw groups of that size.
        steps = [m for m in read_metrics(job / "metrics.jsonl") if "reward" in m]
        assert len(steps) == 1 and all(f"groups/pass@{group_size}" in m for m in steps)
        assert summary["wandb_name"] == f"trainer.num_generations={group_size},trainer.beta={beta}"
        assert summary["wandb_group"] == tmp_path.as_posix()[-128:]
        assert json.loads((job / STATUS_FILE).read_text())["status"] == "finished"
    assert seen == {(g, b) for g in (2, 4, 8) for b in (0.0, 0.04)}
    assert len({summary_of(job)["wandb_name"] for job in jobs}) == 6
    # beta > 0 really used TRL's frozen reference model: a KL term was logged, and only then
    for job in jobs:
        logs_kl = any(m.get("kl") is not None for m in read_metrics(job / "metrics.jsonl"))
        assert logs_kl == (summary_of(job)["beta"] > 0)
    # the sweep's summary table, printed at the end and written as CSV
    assert "sweep " in result.stdout and "trainer.beta" in result.stdout
    rows = list(csv.DictReader((tmp_path / "compare" / "comparison.csv").open()))
    assert len(rows) == 6 and {row["status"] for row in rows} == {"finished"}


@pytest.mark.e2e
def test_a_failing_job_is_reported_and_the_other_jobs_results_are_kept(tmp_path):
    result = run_cli("-m", *QUICK, "logger=none", "trainer.num_generations=1,2", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode != 0  # the sweep reports the failure...
    failed, finished = job_dirs(tmp_path)
    status = json.loads((failed / STATUS_FILE).read_text())
    assert status["status"] == "failed" and "trainer.num_generations=1" in status["error"]
    assert summary_of(finished)["steps"] == 2  # ...after the other job ran to the end
    assert (finished / "checkpoint-final").is_dir()
    assert "failed" in result.stdout and "finished" in result.stdout  # both in the sweep's table
    rows = list(csv.DictReader((tmp_path / "compare" / "comparison.csv").open()))
    assert [row["status"] for row in rows] == ["failed", "finished"]


def _log_span(job: Path) -> tuple[datetime, datetime]:
    stamps = [line[1:24] for line in (job / "train.log").read_text().splitlines() if line.startswith("[20")]
    first, last = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in (stamps[0], stamps[-1]))
    return first, last


@pytest.mark.e2e
def test_the_joblib_launcher_runs_jobs_in_parallel(tiny_sweep):
    """tests/conftest.py's tiny_sweep: two jobs through the joblib launcher, two at a time."""
    first, second = job_dirs(tiny_sweep.run_dir)
    assert {summary_of(first)["trl_num_generations"], summary_of(second)["trl_num_generations"]} == {2, 3}
    (start_a, end_a), (start_b, end_b) = _log_span(first), _log_span(second)
    assert start_a < end_b and start_b < end_a, "the two jobs did not overlap in time"
    assert "sweep " in tiny_sweep.result.stdout


@pytest.mark.e2e
def test_the_optuna_preset_searches_learning_rate_and_beta_against_heldout_accuracy(tmp_path):
    result = run_cli(
        "-m",
        "+experiment=optuna_lr_beta",
        *TINY_RUN,
        "logger=none",
        "hydra.sweeper.n_trials=2",
        "trainer.max_steps=2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"trainer.learning_rate", "trainer.beta"}
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 2
    summaries = [summary_of(job) for job in jobs]
    assert best["best_value"] == max(s["heldout_accuracy_after"] for s in summaries)
    assert all(1e-6 <= s["learning_rate"] <= 1e-4 and 0.0 <= s["beta"] <= 0.1 for s in summaries)
    assert summaries[0]["learning_rate"] != summaries[1]["learning_rate"]


def test_the_slurm_launcher_config_composes_for_a_cluster():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1 and launcher.max_num_timeout == 3
