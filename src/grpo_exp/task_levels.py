"""dataset.levels: reasoning-gym tasks generated at each level of their own curricula (reasoning_gym.coaching).

A task's settings at level L are its curriculum's at global level L (each attribute at min(L, its highest)) over
the user's own settings (dataset.task_config, or a mix's config); a setting that the curriculum sets is refused in
the user's, since it would be overridden. Each (task, level) is its own seeded stream: the first of its problems are
held out, the rest train, as for a task without levels.
"""

from dataclasses import dataclass

import reasoning_gym
from omegaconf import DictConfig, OmegaConf
from reasoning_gym.coaching.attributes import RangeAttributeDefinition
from reasoning_gym.factory import CURRICULA, create_curriculum

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError

LEVEL_SEED_STRIDE = 1009  # level L's stream: dataset.seed + L * stride (the levels do not share problems)


@dataclass(frozen=True)
class TaskLevelRange:
    """A task of the run, its weight in a mix, the user's settings, and the levels it trains at."""

    name: str
    weight: float
    config: dict
    start: int
    top: int


def tasks_of(data_cfg: DictConfig) -> dict[str, tuple[float, dict]]:
    """{task: (weight, the user's settings)}: dataset.tasks' mix, or the one dataset.task."""
    if data_cfg.tasks:
        specs = OmegaConf.to_container(data_cfg.tasks)
        return {
            name: ((spec or {}).get("weight", 1.0), (spec or {}).get("config") or {}) for name, spec in specs.items()
        }
    return {data_cfg.task: (1.0, OmegaConf.to_container(data_cfg.task_config))}


def highest_level(task: str) -> int:
    """The task's curriculum's highest global level: its attribute with the most levels."""
    return max(len(attribute.levels) for attribute in create_curriculum(task).attributes.values()) - 1


def curriculum_settings(task: str) -> set[str]:
    """The settings of the task that its curriculum sets."""
    names = set()
    for attribute in create_curriculum(task).attributes.values():
        if isinstance(attribute, RangeAttributeDefinition):
            names |= {attribute.lower_field_name, attribute.upper_field_name}
        else:
            names.add(attribute.field_name)
    return names


def level_ranges(data_cfg: DictConfig) -> list[TaskLevelRange]:
    """Each task's levels, from dataset.levels.start to .top (null: the task's highest; a higher top stops each
    task at its own highest); refused, one message each: a task without a curriculum, a start above a task's
    highest level, start > top, a user's setting that the curriculum sets."""
    levels = data_cfg.levels
    if levels.top is not None and levels.start > levels.top:
        raise UserError(f"dataset.levels.start={levels.start} > dataset.levels.top={levels.top}: start at or below top")
    key = "dataset.tasks.{}.config" if data_cfg.tasks else "dataset.task_config"
    ranges = []
    for name, (weight, config) in tasks_of(data_cfg).items():
        if name not in CURRICULA:
            with_curricula = ", ".join(sorted(CURRICULA)[:8])
            raise UserError(
                f"dataset.levels: reasoning-gym has no curriculum for the task '{name}' ({len(CURRICULA)} tasks "
                f"have one: {with_curricula}, ...; python -c 'import reasoning_gym.factory as f; "
                "print(sorted(f.CURRICULA))'): use dataset.levels.enabled=false with it"
            )
        highest = highest_level(name)
        if levels.start > highest:
            raise UserError(
                f"dataset.levels.start={levels.start}: the task '{name}' has levels 0 to {highest} in its curriculum"
            )
        overridden = sorted(curriculum_settings(name) & set(config))
        if overridden:
            raise UserError(
                f"{key.format(name)} sets {overridden}, which the task's curriculum sets at each level "
                "(dataset.levels.enabled=true): remove them, or turn the levels off"
            )
        top = highest if levels.top is None else min(levels.top, highest)
        ranges.append(TaskLevelRange(name, float(weight), config, levels.start, top))
    return ranges


def level_config(task: TaskLevelRange, level: int) -> dict:
    """The task's settings at `level`: its curriculum's over the user's."""
    curriculum = create_curriculum(task.name)
    curriculum.set_global_level(level)
    settings = vars(curriculum.generate_configuration(dict(task.config)))
    return {key: value for key, value in settings.items() if key not in ("seed", "size")}


def level_entries(data_cfg: DictConfig) -> tuple[list[tuple[dict, int]], list[tuple[dict, int]]]:
    """(train, held-out) entries of every task at every level of its range, each with its level: per level,
    train_size and eval_size rows split among the tasks by weight (at least one each)."""
    ranges = level_ranges(data_cfg)
    total = sum(task.weight for task in ranges)
    train, held_out = [], []
    for task in ranges:
        share = task.weight / total
        eval_count = max(1, round(data_cfg.eval_size * share))
        train_count = max(1, round((data_cfg.train_size or 1000) * share))
        for level in range(task.start, task.top + 1):
            seed = data_cfg.seed + level * LEVEL_SEED_STRIDE
            stream = reasoning_gym.create_dataset(
                task.name, size=eval_count + train_count, seed=seed, **level_config(task, level)
            )
            kept: dict[str, dict] = {}
            for entry in stream:
                if len(kept) < eval_count:
                    kept.setdefault(entry["question"], entry)
                elif entry["question"] not in kept:
                    train.append((entry, level))
            held_out += [(entry, level) for entry in kept.values()]
    return train, held_out


def check_levels(cfg: DictConfig) -> None:
    """dataset.levels raises a task's level at validations: a run without them would stay at the start."""
    if cfg.dataset.levels.enabled and not cfg.eval.every:
        raise UserError(
            "dataset.levels.enabled=true raises a task's level when a validation finds it mastered, and eval.every=0 "
            "runs no validation: set eval.every=N (and eval.every_problems to bound its cost)"
        )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("dataset.levels",),
        lambda cfg: cfg.dataset.levels.enabled,
        "by reasoning-gym's curricula (dataset.levels.enabled=true)",
        lambda cfg: "dataset.levels.enabled=false",
        "set dataset.levels.enabled=true too",
        but=("dataset.levels.enabled",),
    ),
)
