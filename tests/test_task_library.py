"""reasoning-gym as a task library: a weighted mix of tasks (dataset.tasks), each row keeping its task; labels and a
reward from each task's own score_answer (task_score); statistics and held-out accuracy per task."""

import json
import re
from collections import Counter

import pytest
import reasoning_gym

from grpo_exp.answers import phrase
from grpo_exp.data import load_splits
from grpo_exp.errors import UserError
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from grpo_exp.text import stated_answer
from grpo_exp.verification.labels import Labels, task_score_verifier
from grpo_exp.verification.task_score import task_score
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli

MIX = ["dataset=reasoning_gym_mix", "dataset.eval_size=12", "dataset.train_size=90"]


def entry_of(task: str, seed: int = 3) -> dict:
    return reasoning_gym.create_dataset(task, size=1, seed=seed)[0]


@pytest.mark.parametrize("task", ["syllogism", "isomorphic_strings", "family_relationships", "spell_backward"])
def test_task_score_is_the_tasks_own_grade_of_the_extracted_answer(task):
    entry = entry_of(task)
    stored = json.dumps(entry)
    assert task_score(f"So the answer is \\boxed{{{entry['answer']}}}", stored, phrase) == 1.0
    assert task_score(f"<answer>{entry['answer']}</answer>", stored, phrase) == 1.0
    assert task_score("\\boxed{certainly not this}", stored, phrase) < 1.0
    assert task_score("no answer here", stored, stated_answer) == 0.0  # the run's extractor finds none


def test_task_score_labels_need_the_rows_tasks_and_give_full_marks_only():
    entry = entry_of("spell_backward")
    labels = Labels(task_score_verifier(phrase), phrase, "phrase")
    right, wrong = f"\\boxed{{{entry['answer']}}}", "\\boxed{xyz}"
    stored = json.dumps(entry)
    assert labels([right, wrong, right], [entry["answer"], entry["answer"], None], [stored, stored, None]) == [
        True,
        False,
        None,
    ]
    with pytest.raises(UserError, match="verifier.labels=task_score scores by a reasoning-gym task"):
        labels([right], [entry["answer"]])


def test_a_mix_keeps_each_rows_task_in_proportion_to_its_weight():
    cfg = compose_config([*TINY_RUN, *MIX, "dataset.tasks.syllogism.weight=2.0"])
    train, heldout = load_splits(cfg.dataset)
    counts = Counter(train["task_name"])
    assert set(counts) == {"syllogism", "isomorphic_strings", "family_relationships"}
    assert counts["syllogism"] > max(counts["isomorphic_strings"], counts["family_relationships"])  # weight 2 of 4
    for row in list(train)[:10]:  # each row's entry is its task's own, and its answer the reference
        entry = json.loads(row["task_entry"])
        assert entry["metadata"]["source_dataset"] == row["task_name"] and str(entry["answer"]) == row["solution"]
    assert not set(train["question"]) & set(heldout["question"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+dataset.tasks.syllogism.weight=1"], "dataset.task=basic_arithmetic and dataset.tasks are two ways"),
        (["dataset=reasoning_gym_mix", "+dataset.tasks.sylogism.weight=1"], "dataset.tasks.sylogism='sylogism' is"),
        (["dataset=reasoning_gym_mix", "dataset.tasks.syllogism.weight=0"], "dataset.tasks.syllogism: {weight: a"),
        (
            ["dataset=reasoning_gym_mix", "+dataset.tasks.syllogism.config.nope=1"],
            "dataset.tasks.syllogism.config (nope=1) is invalid",
        ),
        (["dataset=files", "dataset.path=x.jsonl", "verifier.labels=task_score"], "verifier.labels: task_score grades"),
        (["reward=task_score", "dataset=function", "dataset.function=x:y"], "reward: task_score grades"),
    ],
)
def test_a_bad_mix_or_task_score_without_tasks_is_one_message_naming_the_key(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        resolve(compose_config([*TINY_RUN, *overrides]), processes=1)


@pytest.mark.e2e
def test_a_mix_trains_under_its_tasks_own_scores_with_statistics_per_task(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY_RUN, *MIX, "reward=task_score+format", "verifier.labels=task_score", "logger=none",
        "trainer.max_steps=3", "stats.table_every=1", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    tasks = ["family_relationships", "isomorphic_strings", "syllogism"]
    assert summary["heldout_tasks"] == tasks and summary["labels"] == "task_score"
    after = [json.loads(line) for line in (run_dir / "eval_after.jsonl").read_text().splitlines()]
    for task in tasks:
        mine = [s for s in after if s["task_name"] == task]
        assert summary[f"heldout_accuracy_{task}_after"] == pytest.approx(sum(s["correct"] for s in mine) / len(mine))
        answers = {s["answer"].casefold() if s["answer"] else None for s in mine}
        assert summary[f"heldout_distinct_{task}_after"] <= len(answers) / len(mine)
        assert 0.0 < summary[f"heldout_constant_{task}_after"] <= 1.0
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    heldout = {s["question"]: s for s in after}
    assert not any(s["prompt"] in heldout for s in samples)
    for step in (m for m in read_metrics(run_dir / "metrics.jsonl") if "rewards/task_score/mean" in m):
        assert any(key.startswith("tasks/accuracy/") for key in step)  # each task the step sampled
    assert "held-out by task" in result.stdout


def test_any_task_by_name_and_a_missing_name_said_so():
    cfg = compose_config([*TINY_RUN, "dataset=reasoning_gym", "dataset.task=spell_backward", "dataset.train_size=8"])
    train, _ = load_splits(cfg.dataset)
    assert set(train["task_name"]) == {"spell_backward"}
    with pytest.raises(UserError, match="dataset.task is required: name a reasoning-gym task"):
        resolve(compose_config([*TINY_RUN, "dataset=reasoning_gym"]), processes=1)


def test_a_constant_answer_is_the_bar_a_gain_on_labels_must_clear():
    from grpo_exp.stats import constant_answer_accuracy, distinct_answer_share

    assert constant_answer_accuracy(["Yes", "yes", "No", "Yes."]) == 0.75  # answering "Yes" to all of them
    assert constant_answer_accuracy(["son", "father", "aunt", "son"]) == 0.5
    assert distinct_answer_share(["Yes", "yes.", "YES"]) == pytest.approx(1 / 3)  # collapsed to one answer
    assert distinct_answer_share(["a", "b", None]) == 1.0
