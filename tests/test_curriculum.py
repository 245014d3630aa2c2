"""The curriculum over each training prompt's difficulty (curriculum.*): the pool of recent pass rates, the draw of
each step's prompts from the band with revisits, the same draw on every process, and the pool kept with checkpoints."""

import json
import math
from collections import Counter

import pytest

from grpo_exp.errors import UserError
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from grpo_exp.trainer.curriculum import STATE_FILE, DifficultyPool
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli

QUESTIONS = [f"q{i}" for i in range(10)]


def pool(**settings) -> DifficultyPool:
    values = {"low": 0.2, "high": 0.8, "revisit": 0.25, "window": 2, "seed": 7} | settings
    return DifficultyPool(QUESTIONS, **values)


def test_the_pass_rate_is_the_mean_of_the_last_window_groups_and_nan_teaches_nothing():
    p = pool()
    p.observe(["q0", "q0", "q0", "q1", "nope"], [0.0, 1.0, 0.5, math.nan, 1.0])
    assert p.pass_rate(0) == 0.75  # the last two: 1.0 and 0.5
    assert p.pass_rate(1) is None and p.in_band(1)  # never judged: unseen, in the band


def test_each_step_draws_from_the_band_and_revisits_the_others():
    p = pool()
    p.observe(["q0", "q1", "q2", "q3"], [0.0, 1.0, 0.0, 1.0])  # too hard, too easy, too hard, too easy
    p.observe(["q4"], [0.5])  # in the band; q5..q9 unseen: in the band too
    outside = {0, 1, 2, 3}
    counts = Counter()
    for step in range(1, 201):
        chosen = p.choose(4, step)
        assert len(chosen) == 4 and len(set(chosen)) == 4  # no repeats while there are enough
        assert sum(row in outside for row in chosen) == 1  # revisit 0.25 of 4 groups
        counts.update(chosen)
    assert set(counts) == set(range(10))  # nothing starves
    assert min(counts[row] for row in range(4, 10)) > max(counts[row] for row in outside)
    assert p.choose(4, 5) == p.choose(4, 5) and p.choose(4, 5) != p.choose(4, 6)  # one seed: every process agrees


def test_without_revisits_only_the_band_trains_and_an_empty_band_draws_from_all():
    p = pool(revisit=0.0)
    p.observe(QUESTIONS[:8], [1.0] * 8)
    assert set(p.choose(6, 1)) <= {8, 9}  # repeats once the band is used up
    p.observe(QUESTIONS[8:], [0.0, 0.0])
    assert len(p.choose(6, 1)) == 6  # everything too easy or too hard: drawn from all of it


def test_the_pool_is_saved_and_loaded(tmp_path):
    p = pool()
    p.observe(["q0", "q0", "q0", "q3"], [0.0, 1.0, 1.0, 0.5])
    p.save(tmp_path / STATE_FILE)
    restored = pool()
    restored.load(tmp_path / STATE_FILE)
    assert [restored.pass_rate(r) for r in range(10)] == [p.pass_rate(r) for r in range(10)]
    restored.observe(["q0"], [0.0])
    assert restored.pass_rate(0) == 0.5  # the window carried: 1.0 and 0.0
    assert p.metrics()["curriculum/too_easy"] == 0.1 and p.metrics()["curriculum/in_band"] == 0.1
    assert p.metrics()["curriculum/unseen"] == 0.8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["curriculum.enabled=true", "curriculum.low=0.9", "curriculum.high=0.5"], "needs low < high"),
        (["curriculum.revisit=0.5"], "curriculum.revisit"),  # a setting of a curriculum that is off
    ],
)
def test_a_bad_curriculum_is_one_message_naming_the_key(overrides, message):
    with pytest.raises(UserError, match=message):
        resolve(compose_config([*TINY_RUN, *overrides]), processes=1)


@pytest.mark.e2e
def test_a_run_draws_its_prompts_by_difficulty_resamples_and_keeps_the_pool_with_its_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY_RUN, "dataset.train_size=12", "reward=math+length", "logger=none", "trainer.max_steps=3",
        "trainer.zero_variance_groups=resample", "trainer.save_steps=1", "trainer.keep_checkpoints=true",
        "curriculum.enabled=true", "curriculum.revisit=0.5", "stats.table_every=1", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "curriculum/unseen" in m]
    assert len(steps) == 3
    assert steps[0]["curriculum/unseen"] == 1.0 and steps[-1]["curriculum/unseen"] < 1.0
    for m in steps:
        shares = ("unseen", "too_hard", "in_band", "too_easy")
        assert sum(m[f"curriculum/{key}"] for key in shares) == pytest.approx(1.0)
    saved = json.loads((run_dir / "trainer" / "checkpoint-3" / STATE_FILE).read_text())  # what a resume loads
    assert saved and all(0.0 <= rate <= 1.0 for rates in saved.values() for rate in rates)
    # the pool the last step drew from, and that step's own groups: at least as many prompts seen
    assert len(saved) >= round((1 - steps[-1]["curriculum/unseen"]) * 12)
