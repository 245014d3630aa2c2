"""A reasoning-gym task scored by its own rules: each task's `score_answer(answer, entry)`, partial credit in [0, 1].

The rows of a reasoning-gym dataset (grpo_exp.data) keep their task's name and whole entry (`task_entry`, JSON: the
question, the answer and the metadata that some tasks' scorers read). The run's answer extractor (verifier.answer)
reads the completion's final answer; the task's scorer grades it. `verifier.labels=task_score` labels an answer
correct when it scores 1; the `task_score` reward gives the score itself.
"""

import functools
import json
from collections.abc import Callable

from omegaconf import DictConfig

from grpo_exp.answers import AnswerExtractor
from grpo_exp.errors import UserError
from grpo_exp.schema import DataSource

ENTRY = "task_entry"  # the dataset column that holds each row's reasoning-gym entry (JSON)


@functools.cache
def _scorer(task: str) -> Callable:
    """The task's score_answer, built once per task (reasoning-gym builds a dataset object for it; reasoning-gym is
    imported here, when a task is scored, not where the labels are only named)."""
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(task)


def task_score(completion: str, entry: str, extract: AnswerExtractor) -> float:
    """The task's own grade of the completion's final answer (`extract`: the run's extractor); 0 without one."""
    record = json.loads(entry)
    answer = extract(completion)
    if answer is None:
        return 0.0
    return float(_scorer(record["metadata"]["source_dataset"])(answer, record))


def missing_entries(where: str) -> UserError:
    return UserError(
        f"{where} scores by a reasoning-gym task's own rules, and these rows have no task (no {ENTRY} column): use a "
        "reasoning-gym dataset (dataset.task or dataset.tasks), or verifier.labels=exact_match / math_verify"
    )


def entries_of(dataset, repeat: int = 1) -> list[str | None] | None:
    """The rows' task entries, each repeated `repeat` times (one per answer); None for a dataset without them."""
    if ENTRY not in dataset.column_names:
        return None
    return [entry for entry in dataset[ENTRY] for _ in range(repeat)]


def check_task_rows(key: str, dataset: DictConfig) -> None:
    """task_score (`key`: the labels or the reward) grades by a reasoning-gym task's own rules: only rows of such a
    task have one."""
    if dataset.source is not DataSource.reasoning_gym:
        raise UserError(
            f"{key}: task_score grades by a reasoning-gym task's own rules, and dataset={dataset.name} takes "
            f"its rows from {dataset.source.value}: use a reasoning-gym dataset (dataset.task or "
            "dataset=reasoning_gym_mix), or exact_match / math_verify / correct"
        )
