"""dataset.levels: reasoning-gym's own curricula, each task's level raised when a validation finds it mastered."""

import json
import re

import pytest

from grpo_exp.data import load_splits
from grpo_exp.errors import UserError
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from grpo_exp.task_levels import level_config, level_ranges
from grpo_exp.trainer.curriculum import DifficultyPool
from grpo_exp.trainer.levels import LevelChooser, TaskLevels, accuracy_by_level, level_accuracies
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli

SPELL = ["dataset=reasoning_gym", "dataset.task=spell_backward", "dataset.levels.enabled=true", "eval.every=1"]


def test_each_level_is_the_curriculums_settings_over_the_users():
    cfg = compose_config([*SPELL, "dataset.levels.top=2", "+dataset.task_config.data_file=words3to10.txt"])
    [task] = level_ranges(cfg.dataset)
    assert (task.name, task.start, task.top) == ("spell_backward", 0, 2)
    words = [level_config(task, level)["max_word_len"] for level in range(3)]
    assert words == [3, 5, 7]  # reasoning-gym's spell_backward curriculum: word_len levels 3, 5, 7, 9, 10
    assert level_config(task, 1)["data_file"] == "words3to10.txt", "the user's own setting kept"
    assert level_ranges(compose_config(SPELL).dataset)[0].top == 4, "top null: the curriculum's highest level"


def test_the_rows_of_every_level_are_generated_held_out_apart_and_tagged():
    cfg = compose_config([*SPELL, "dataset.levels.top=2", "dataset.eval_size=5", "dataset.train_size=20"])
    train, heldout = load_splits(cfg.dataset)
    for split, count in ((train, 20), (heldout, 5)):
        levels = split["task_level"]
        assert [levels.count(level) for level in range(3)] == [count] * 3
    assert not set(train["question"]) & set(heldout["question"])
    longest = {}
    for row in train:
        word = row["question"].split(":")[-1].strip().rstrip(".")  # "Spell this word backward ...: <word>"
        longest[row["task_level"]] = max(longest.get(row["task_level"], 0), len(word))
    assert longest[0] == 3 and longest[0] < longest[2] <= 7, longest


def test_a_mix_splits_each_levels_rows_among_its_tasks_by_weight():
    cfg = compose_config(
        ["dataset=reasoning_gym_mix", "dataset.levels.enabled=true", "dataset.levels.top=1", "eval.every=1"]
        + ["dataset.eval_size=8", "dataset.train_size=40", "dataset.tasks.syllogism.weight=2"]
    )
    train, _ = load_splits(cfg.dataset)
    pairs = list(zip(train["task_name"], train["task_level"], strict=True))
    assert pairs.count(("syllogism", 1)) == 20 and pairs.count(("isomorphic_strings", 0)) == 10


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*SPELL, "dataset.task=gsm_symbolic"], "no curriculum for the task 'gsm_symbolic'"),
        ([*SPELL, "dataset.levels.start=9"], "dataset.levels.start=9: the task 'spell_backward' has levels 0 to 4"),
        ([*SPELL, "dataset.levels.start=2", "dataset.levels.top=1"], "dataset.levels.start=2 > dataset.levels.top=1"),
        ([*SPELL, "+dataset.task_config.max_word_len=4"], "dataset.task_config sets ['max_word_len'], which the"),
        ([*SPELL, "eval.every=0"], "eval.every=0 runs no validation: set eval.every=N"),
        ([*SPELL, "dataset.levels.enabled=false", "dataset.levels.threshold=0.5"], "dataset.levels.enabled=false"),
        (["dataset=gsm8k", "dataset.levels.enabled=true", "eval.every=1"], "for a reasoning-gym task"),
    ],
)
def test_what_the_levels_cannot_do_is_refused_naming_the_key(overrides, message, no_model_loads):
    with pytest.raises(UserError, match=re.escape(message)):
        resolve(compose_config([*TINY_RUN, *overrides]))


def sample(task, level, correct):
    return {"task_name": task, "task_level": level, "correct": correct}


def test_a_task_moves_up_when_its_accuracy_at_its_level_reaches_the_threshold():
    levels = TaskLevels([], [], {"a": 0, "b": 0, "c": 1}, {"a": 2, "b": 2, "c": 1}, threshold=0.5)
    samples = [sample("a", 0, True), sample("a", 0, False), sample("a", 0, None)]  # a: 1/2 = 0.5, None not counted
    samples += [sample("b", 0, True), sample("b", 0, False), sample("b", 0, False)]  # b: 1/3
    samples += [sample("b", 1, True)] * 5  # another level than b's: not counted
    samples += [sample("c", 1, True)]  # c: mastered, but at its top
    assert level_accuracies(samples, levels.current) == {"a": 0.5, "b": pytest.approx(1 / 3), "c": 1.0}
    moved = levels.raise_levels(samples, step=4)
    assert moved == ["a: level 0 -> 1 at step 4 (held-out accuracy 0.500 >= dataset.levels.threshold=0.5)"]
    assert levels.current == {"a": 1, "b": 0, "c": 1}
    assert levels.metrics() == {"levels/a": 1.0, "levels/b": 0.0, "levels/c": 1.0}
    assert accuracy_by_level(samples) == {
        ("a", 0): 0.5,
        ("b", 0): pytest.approx(1 / 3),
        ("b", 1): 1.0,
        ("c", 1): 1.0,
    }


def test_a_step_draws_only_rows_at_the_current_levels_and_the_levels_resume(tmp_path):
    train = [("a", 0), ("a", 1), ("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    levels = TaskLevels(train, [("a", 0), ("a", 1)], {"a": 1, "b": 0}, {"a": 1, "b": 1}, threshold=0.7)
    assert levels.train_rows() == [1, 3, 5] and levels.heldout_rows() == [1]
    chooser = LevelChooser(levels, None, seed=3)
    drawn = chooser.choose(6, step=1)
    assert sorted(drawn) == [1, 1, 3, 3, 5, 5], "without repeats while there are enough, then each again"
    assert chooser.choose(6, step=1) == drawn, "seeded by (seed, step): every process draws the same"
    pool = DifficultyPool([f"q{i}" for i in range(6)], 0.1, 0.9, 0.0, 3, seed=3)
    pool.observe(["q1"], [1.0])  # too easy: out of the band
    assert set(LevelChooser(levels, pool, seed=3).choose(4, step=2)) == {3, 5}, "the band, among the level's rows"

    levels.save(tmp_path / "levels.json")
    resumed = TaskLevels(train, [], {"a": 0, "b": 0}, {"a": 1, "b": 1}, threshold=0.7)
    resumed.load(tmp_path / "levels.json")
    assert resumed.current == {"a": 1, "b": 0}


@pytest.mark.e2e
def test_a_run_raises_each_tasks_level_at_its_validations_and_trains_at_the_new_level(tmp_path):
    """Threshold 0: every validation finds each task mastered (the tiny model is never right), so each level is
    raised at each validation, from 0 at the start to the top, 2; the steps after draw their prompts at the level."""
    run_dir = tmp_path / "run"
    overrides = [*TINY_RUN, "dataset=reasoning_gym_mix", "dataset.eval_size=6", "dataset.train_size=12"]
    overrides += ["dataset.levels.enabled=true", "dataset.levels.top=2", "dataset.levels.threshold=0.0"]
    overrides += ["eval.every=1", "trainer.max_steps=3", "trainer.save_steps=1", "trainer.keep_checkpoints=true"]
    overrides += ["reward=task_score", "verifier.labels=task_score", "logger=none", "stats.table_every=1"]
    result = run_cli(*overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    tasks = ("family_relationships", "isomorphic_strings", "syllogism")
    validations = [m for m in read_metrics(run_dir / "metrics.jsonl") if "levels/syllogism" in m]
    assert [(m["step"], [m[f"levels/{task}"] for task in tasks]) for m in validations] == [
        (0, [1.0] * 3),  # the initial validation: level 0 mastered
        (1, [2.0] * 3),
        (2, [2.0] * 3),  # at the top
        (3, [2.0] * 3),
    ]
    log = (run_dir / "train.log").read_text()
    assert "Level raised: syllogism: level 1 -> 2 at step 1" in log
    drawn = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        drawn.setdefault(row["step"], set()).add(row["task_level"])
    assert drawn[1] == {1} and drawn[2] == {2} and drawn[3] == {2}, drawn
    assert json.loads((run_dir / "trainer" / "checkpoint-3" / "levels.json").read_text()) == dict.fromkeys(tasks, 2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["level_syllogism_final"] == 2
    assert {f"heldout_accuracy_syllogism_level{level}_after" for level in range(3)} <= set(summary)


def test_the_shipped_mix_has_a_curriculum_for_every_task():
    cfg = compose_config(["dataset=reasoning_gym_mix", "dataset.levels.enabled=true"])
    assert [task.name for task in level_ranges(cfg.dataset)] == [
        "syllogism",
        "isomorphic_strings",
        "family_relationships",
    ]
