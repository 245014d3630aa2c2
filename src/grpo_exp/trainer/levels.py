"""dataset.levels: each reasoning-gym task trains at one level of its own curriculum, raised as the policy masters it.

The rows of every level are generated up front (grpo_exp.task_levels), each with its task and level. A step draws
its prompts from the rows at their task's current level; a validation answers the held-out rows at the current
levels, and a task whose accuracy there reaches the threshold moves up one level (up to its top). Every process
validates on the same gathered answers and draws with the same seed, so all agree on the levels. The levels travel
with checkpoints (levels.json) for resume.
"""

import json
import logging
from pathlib import Path

from grpo_exp.trainer.curriculum import DifficultyPool, draw, step_rng

STATE_FILE = "levels.json"  # each task's level, in each checkpoint directory

log = logging.getLogger(__name__)


class TaskLevels:
    def __init__(
        self,
        train: list[tuple[str, int]],
        heldout: list[tuple[str, int]],
        start: dict[str, int],
        top: dict[str, int],
        threshold: float,
    ):
        """`train`, `heldout`: each row's (task, level); `start`, `top`: each task's first and highest level."""
        self.train, self.heldout = train, heldout
        self.current, self.top, self.threshold = dict(start), dict(top), threshold

    def train_rows(self) -> list[int]:
        return [i for i, (task, level) in enumerate(self.train) if self.current[task] == level]

    def heldout_rows(self) -> list[int]:
        return [i for i, (task, level) in enumerate(self.heldout) if self.current[task] == level]

    def raise_levels(self, samples: list[dict], step: int) -> list[str]:
        """Each task whose held-out accuracy at its current level, in `samples` (a validation's answers to rows at
        the current levels: task_name, task_level, correct), reaches the threshold moves up one level, unless at
        its top. Returns what moved, for the log. Answers without a label do not count."""
        moved = []
        for task, accuracy in level_accuracies(samples, self.current).items():
            if accuracy >= self.threshold and self.current[task] < self.top[task]:
                level = self.current[task]
                self.current[task] = level + 1
                moved.append(
                    f"{task}: level {level} -> {level + 1} at step {step} (held-out accuracy {accuracy:.3f} "
                    f">= dataset.levels.threshold={self.threshold})"
                )
        for message in moved:
            log.info("Level raised: %s", message)
        return moved

    def metrics(self) -> dict[str, float]:
        return {f"levels/{task}": float(level) for task, level in sorted(self.current.items())}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.current), encoding="utf-8")

    def load(self, path: Path) -> None:
        """A checkpoint's levels; a checkpoint written without them leaves the start levels."""
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            self.current |= {task: int(level) for task, level in saved.items() if task in self.current}


def level_accuracies(samples: list[dict], current: dict[str, int]) -> dict[str, float]:
    """Each task's accuracy over the samples at its current level (None labels left out). Pure."""
    return {task: a for (task, level), a in accuracy_by_level(samples).items() if current.get(task) == level}


class LevelChooser:
    """The rows a step trains on, at the current levels: drawn by the difficulty curriculum among them when it is
    on (curriculum.enabled), else at random (seeded by (seed, step), without repeats while there are enough)."""

    def __init__(self, levels: TaskLevels, pool: DifficultyPool | None, seed: int):
        self.levels, self.pool, self.seed = levels, pool, seed

    def choose(self, groups: int, step: int) -> list[int]:
        rows = self.levels.train_rows()
        if self.pool is not None:
            return self.pool.choose(groups, step, among=rows)
        return draw(step_rng(self.seed, step), rows, groups)

    def observe(self, questions: list[str], pass_rates: list[float]) -> None:
        if self.pool is not None:
            self.pool.observe(questions, pass_rates)

    def pass_rates(self) -> list[float]:
        return self.pool.pass_rates() if self.pool is not None else []

    def metrics(self) -> dict[str, float]:
        """The difficulty pool's; the levels are logged by the validations that move them."""
        return self.pool.metrics() if self.pool is not None else {}


def accuracy_by_level(samples: list[dict]) -> dict[tuple[str, int], float]:
    """The held-out accuracy of each (task, level) in `samples` (None labels left out), in order. Pure."""
    counts: dict[tuple[str, int], list[int]] = {}
    for sample in samples:
        if "task_level" in sample and sample.get("correct") is not None:
            counts.setdefault((sample.get("task_name"), sample["task_level"]), []).append(int(bool(sample["correct"])))
    return {key: sum(values) / len(values) for key, values in sorted(counts.items())}
