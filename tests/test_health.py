"""The policy's health (health.*): the entropy alarm and the truncation warning, by hand and on a run made to
collapse and truncate."""

import json

import pytest

from grpo_exp.analysis.alarms import entropy_alarm, truncation_warning
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN
from tests.helpers.cli import run_cli


def test_the_entropy_alarm_fires_on_a_collapse_beyond_noise_by_hand():
    """First window mean 10, last 1: x0.10, under 0.2. Welch by hand: the difference -9, standard error
    sqrt(0.04/3 + 0.25/3) = 0.3109, 2.62 degrees of freedom, t = 3.455: -9 -+ 1.074."""
    entropies = [10.0, 10.5, 9.5, 5.0, 1.0, 1.2, 0.8]
    found = entropy_alarm(entropies, window=3, collapse_below=0.2, blowup_above=3.0)
    assert found.startswith("the policy's entropy collapsed: 10.000 -> 1.000 nats a token")
    assert "x0.10" in found and "change -9.000, 95% interval -10.075 to -7.925" in found
    assert entropy_alarm(entropies[:5], 3, 0.2, 3.0) is None  # fewer than two windows
    assert entropy_alarm(entropies, 3, 0.05, 3.0) is None  # not under the threshold


def test_the_entropy_alarm_stays_silent_within_noise_and_fires_on_a_blow_up():
    noisy = [2.0, 0.1, 4.0, 0.2, 0.1, 0.3]  # the last window's mean is 0.2 of 2.03, but the start is all noise
    assert entropy_alarm(noisy, window=3, collapse_below=0.5, blowup_above=3.0) is None
    blown = [1.0, 1.0, 1.0, 4.0, 4.0, 4.0]  # no spread: the difference itself is the interval
    found = entropy_alarm(blown, window=3, collapse_below=0.2, blowup_above=3.0)
    assert "blew up: 1.000 -> 4.000" in found and "x4.00" in found and "interval +3.000 to +3.000" in found
    assert entropy_alarm(blown, window=3, collapse_below=0.2, blowup_above=5.0) is None


def test_the_truncation_warning_goes_by_the_wilson_interval_of_the_cut_share():
    """8 completions a step, 5 steps: 40. 24 cut (0.6): Wilson's lower bound 0.446, not above 0.5: silent.
    28 cut (0.7): 0.546: it warns. All cut: 0.912."""
    assert truncation_warning([0.5, 0.875, 0.5, 0.625, 0.5], 8, 5, 0.5) is None
    found = truncation_warning([0.75, 0.625, 0.75, 0.75, 0.625], 8, 5, 0.5)
    assert found.startswith("28 of the last 40 completions (70%, 95% interval from 0.55) were cut")
    assert "raise trainer.max_completion_length" in found
    assert "(100%, 95% interval from 0.91)" in truncation_warning([0.0] * 3 + [1.0] * 5, 8, 5, 0.5)
    assert truncation_warning([1.0] * 4, 8, 5, 0.5) is None  # before a window of steps


@pytest.mark.e2e
def test_a_run_made_to_collapse_and_truncate_sounds_both_and_stops_on_the_entropy(tmp_path):
    """The tiny model rewarded for short completions at a large learning rate: its entropy falls from ~10.8 nats
    to under 2 within ten steps (and every completion is cut at 16 tokens: it never writes an end)."""
    result = run_cli(
        *TINY_RUN,
        "logger=none",
        "reward=length",
        "trainer.learning_rate=0.05",
        "trainer.max_steps=16",
        "trainer.zero_variance_groups=keep",
        "eval.before=false",
        "eval.after=false",
        "health.window=3",
        "health.entropy_alarm=stop",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "the policy's entropy collapsed" in summary["entropy_alarm"]
    assert summary["health_stopped"].endswith("(health.entropy_alarm=stop)")
    assert summary["steps"] < 16, "stopped at the alarm"
    assert summary["truncation_warning"].startswith("step 3: 12 of the last 12 completions (100%")
    assert summary["entropy_last"] < 0.2 * summary["entropy_first"]
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(m.get("alarm/entropy") == 1.0 for m in metrics) and any(m.get("alarm/truncation") for m in metrics)
    console = result.stdout + result.stderr
    assert "Entropy alarm at step" in console and "Truncation warning at step 3" in console
    assert "policy health" in console  # the summary's table


@pytest.mark.slow
def test_held_out_answers_that_are_all_cut_before_training_are_refused(tmp_path):
    """The embedded model (it does end its answers) given 3 tokens: every held-out answer runs to the limit, so
    nothing can be judged and training would cut every completion. Refused before the first step, naming the key."""
    result = run_cli(
        "logger=none", "trainer.max_completion_length=3", "dataset.eval_size=4", "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode != 0
    error = result.stdout + result.stderr
    assert "every one of the 4 held-out answers of the initial model ran to the limit of 3 tokens" in error
    assert "trainer.max_completion_length=3" in error and "health.truncation=off" in error
    assert "Traceback" not in error
    assert not (tmp_path / "metrics.jsonl").exists(), "no step was trained"
