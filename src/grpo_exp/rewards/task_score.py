"""A reasoning-gym task's own grade as a reward: its score_answer's partial credit in [0, 1] for the completion's
final answer (read by the run's extractor, verifier.answer); None (skipped) for a row without a task (the
self-verification task's verification prompts). Needs a reasoning-gym dataset: dataset.task or dataset.tasks.
    grpo-exp train dataset=reasoning_gym_mix reward=task_score
"""

from dataclasses import dataclass

from omegaconf import MISSING, DictConfig

from grpo_exp.rewards.components import reward_component
from grpo_exp.text import completion_text
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.task_score import check_task_rows, missing_entries, task_score


@dataclass
class TaskScoreReward:
    # A reasoning-gym task's own score_answer of the final answer, partial credit in [0, 1] (needs dataset.task or
    # dataset.tasks: each row keeps its task).
    weight: float = MISSING


def _check_in_run(settings: DictConfig, cfg: DictConfig, processes: int) -> None:
    check_task_rows("reward", cfg.dataset)


@reward_component("task_score", TaskScoreReward, check=_check_in_run)
def make_task_score_reward(verifier: Labels):
    def task_score_reward(completions, task_entry=None, **kwargs) -> list[float | None]:
        """The task's own score of each completion's final answer."""
        if task_entry is None:
            raise missing_entries("reward=task_score")
        return [
            None if entry is None else task_score(completion_text(c), entry, verifier.answer)
            for c, entry in zip(completions, task_entry, strict=True)
        ]

    task_score_reward.__name__ = "task_score"
    return task_score_reward
