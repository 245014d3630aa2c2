"""The live console view: its one line per logging step, and a real tiny run that shows it instead of the dict dump."""

import math

import pytest
from transformers import TrainerControl, TrainerState

from grpo_exp.run.console import ConsoleView, format_step
from grpo_exp.run.tracking import read_metrics

STEP_LOGS = {
    "loss": 0.01,
    "completions/mean_length": 12.0,
    "rewards/math/mean": 0.25,
    "rewards/math/std": 0.4,
    "rewards/format/mean": 1.0,
    "rewards/format/std": 0.0,
    "reward": 0.625,
    "frac_reward_zero_std": 0.5,
    "kl": 0.00123,
}


def test_a_step_shows_the_reward_its_components_kl_and_the_held_out_accuracy_before():
    line = format_step(STEP_LOGS, step=3, max_steps=10, heldout_before=0.25, seconds_per_step=1.5)
    assert line == (
        "step 3/10 | reward 0.625 (math 0.250, format 1.000) | frac_zero_std 0.50 | kl 0.00123"
        " | held-out before 0.250 | 1.50 s/step, ETA 0:00:10"
    )


def test_what_is_not_logged_or_not_known_is_left_out():
    assert format_step({"reward": 0.5}, step=1, max_steps=2) == "step 1/2 | reward 0.500"
    without_kl = {k: v for k, v in STEP_LOGS.items() if k != "kl"}  # beta=0: TRL logs no kl
    assert "kl" not in format_step(without_kl, step=1, max_steps=2)
    assert "held-out" not in format_step(STEP_LOGS, step=1, max_steps=2, heldout_before=None)


def test_nan_and_none_values_read_n_a():
    # TRL logs None for a reward function that scored no completion of the step
    logs = {"reward": math.nan, "rewards/judge/mean": None, "frac_reward_zero_std": math.nan}
    assert format_step(logs, step=1, max_steps=2) == "step 1/2 | reward n/a (judge n/a) | frac_zero_std n/a"


def test_log_events_that_are_not_training_steps_print_nothing(capsys):
    summary = {"train_runtime": 2.3, "train_samples_per_second": 3.4, "train_loss": 0.0, "epoch": 0.06}
    assert format_step(summary, step=2, max_steps=2) is None
    view, control = ConsoleView(heldout_before=lambda: 0.5), TrainerControl()
    view.on_log(None, TrainerState(global_step=2, max_steps=2), control, logs=summary)
    view.on_log(None, TrainerState(global_step=2, max_steps=2, is_world_process_zero=False), control, logs=STEP_LOGS)
    assert capsys.readouterr().out == ""


@pytest.mark.e2e
def test_a_tiny_run_prints_the_compact_line_and_still_records_every_metric(tiny_cli_run):
    console = tiny_cli_run.console
    assert "step 2/2 | reward " in console and "held-out before " in console
    # transformers' dump of the whole metric dict is gone
    assert "'completions/mean_length'" not in console and "'train_runtime'" not in console
    metrics = read_metrics(tiny_cli_run.run_dir / "metrics.jsonl")
    steps = [m for m in metrics if "reward" in m]
    assert len(steps) == 2 and all("completions/mean_length" in m and "rewards/math/mean" in m for m in steps)
    assert any("train_runtime" in m for m in metrics)


def test_a_resampling_step_shows_how_many_generation_batches_it_took():
    line = format_step({"reward": 0.5, "frac_reward_zero_std": 0.75, "resample/batches": 3.0}, step=2, max_steps=4)
    assert line == "step 2/4 | reward 0.500 | frac_zero_std 0.75 | batches 3"
