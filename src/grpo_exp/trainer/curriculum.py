"""A curriculum over each training prompt's difficulty (curriculum.enabled): what the next step trains on is chosen by
how often the policy has lately solved each prompt.

Each training prompt keeps its recent pass rate: the share of its group the run's labels called correct, over the
last `window` times it was sampled (groups of every process: each process observes the same gathered batch, so all
agree). Each step's prompts are drawn from those whose pass rate lies in [low, high], or that were never sampled;
`revisit` of them from the others (too easy or too hard, for now), so that none is starved and a prompt whose
difficulty changed is seen again. GRPO learns nothing from a group that is all right or all wrong, so prompts inside
the band are those that pay for their generation. The draw is seeded by (seed, step) and made for every process's
groups together; each process takes its share. The pool travels with checkpoints (curriculum.json) for resume.
"""

import json
import math
import random
from collections import deque
from pathlib import Path

from omegaconf import DictConfig
from transformers import TrainerCallback

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError

STATE_FILE = "curriculum.json"  # the pool, in each checkpoint directory


class DifficultyPool:
    def __init__(self, questions: list[str], low: float, high: float, revisit: float, window: int, seed: int):
        self.index = {question: i for i, question in enumerate(questions)}  # a repeated question: its last row
        self.size = len(questions)
        self.low, self.high, self.revisit, self.window, self.seed = low, high, revisit, window, seed
        self.rates: dict[int, deque] = {}

    def pass_rate(self, row: int) -> float | None:
        """The row's recent pass rate, None while never sampled."""
        seen = self.rates.get(row)
        return sum(seen) / len(seen) if seen else None

    def in_band(self, row: int) -> bool:
        rate = self.pass_rate(row)
        return rate is None or self.low <= rate <= self.high

    def observe(self, questions: list[str], pass_rates: list[float]) -> None:
        """One pass rate per group (NaN: its labels could not judge any answer, nothing learned of it)."""
        for question, rate in zip(questions, pass_rates, strict=True):
            row = self.index.get(question)
            if row is not None and not math.isnan(rate):
                self.rates.setdefault(row, deque(maxlen=self.window)).append(rate)

    def choose(self, groups: int, step: int, among: list[int] | None = None) -> list[int]:
        """The training rows of a step's `groups` groups (every process's): `revisit` of them (rounded, at least one
        when any rate is outside the band and revisit > 0) from outside the band, the others from inside it; without
        repeats while each side has enough rows. `among`: the rows to choose from (dataset.levels: those at the
        current levels), else all."""
        rng = step_rng(self.seed, step)
        rows = range(self.size) if among is None else among
        inside = [row for row in rows if self.in_band(row)]
        outside = [row for row in rows if not self.in_band(row)]
        revisits = min(len(outside), max(round(self.revisit * groups), 1 if self.revisit > 0 else 0))
        if not inside:  # everything is too easy or too hard: draw from all of it
            inside, revisits = outside, 0
        chosen = draw(rng, outside, revisits) + draw(rng, inside, groups - revisits)
        rng.shuffle(chosen)
        return chosen

    def metrics(self) -> dict[str, float]:
        """The pool's difficulty: the shares of its prompts never sampled, too hard (< low), in the band, too easy
        (> high), and the sampled ones' mean pass rate."""
        rates = [self.pass_rate(row) for row in range(self.size)]
        seen = [rate for rate in rates if rate is not None]
        shares = {
            "unseen": (self.size - len(seen)) / self.size,
            "too_hard": sum(rate < self.low for rate in seen) / self.size,
            "in_band": sum(self.low <= rate <= self.high for rate in seen) / self.size,
            "too_easy": sum(rate > self.high for rate in seen) / self.size,
        }
        if seen:
            shares["pass_rate_mean"] = sum(seen) / len(seen)
        return {f"curriculum/{key}": value for key, value in shares.items()}

    def pass_rates(self) -> list[float]:
        """Every sampled prompt's recent pass rate (the pool's difficulty histogram)."""
        return [rate for rate in map(self.pass_rate, range(self.size)) if rate is not None]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({str(row): list(seen) for row, seen in self.rates.items()}), encoding="utf-8")

    def load(self, path: Path) -> None:
        """A checkpoint's pool; a checkpoint written without the curriculum leaves it empty (every prompt unseen)."""
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            self.rates = {int(row): deque(seen, maxlen=self.window) for row, seen in saved.items()}


def step_rng(seed: int, step: int) -> random.Random:
    """The draw of a step: the same on every process."""
    return random.Random(seed * 1_000_003 + step)


def draw(rng: random.Random, rows: list[int], count: int) -> list[int]:
    """`count` of `rows`, without repeats while there are enough of them."""
    if count <= 0 or not rows:
        return []
    whole, rest = divmod(count, len(rows))
    return [row for _ in range(whole) for row in rng.sample(rows, len(rows))] + rng.sample(rows, rest)


class SaveState(TrainerCallback):
    """A run's state (the difficulty pool, the task levels: any object with save(path)) beside each checkpoint the
    trainer saves (main process), as `file`, for a resumed run to continue it."""

    def __init__(self, state, file: str):
        self.state, self.file = state, file

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if directory.is_dir():
                self.state.save(directory / self.file)


def check_curriculum(curriculum_cfg: DictConfig) -> None:
    if curriculum_cfg.enabled and not curriculum_cfg.low < curriculum_cfg.high:
        raise UserError(
            f"curriculum.low={curriculum_cfg.low} and curriculum.high={curriculum_cfg.high}: the band of pass rates "
            "to train on needs low < high"
        )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("curriculum",),
        lambda cfg: cfg.curriculum.enabled,
        "by the curriculum over prompts' difficulty (curriculum.enabled=true)",
        lambda cfg: "curriculum.enabled=false",
        "set curriculum.enabled=true too",
        but=("curriculum.enabled",),
    ),
)
