"""The models a run keeps from its validations: the eval.keep_top_k best by eval.best_metric (ties: the earlier
step), the best as checkpoint-best and the others as checkpoint-top/step-<N>, each with best.json naming its step
and value; a resumed run carries those of the steps it does not train again.

Which validations happen, and what they measure, is grpo_exp.run.validation's; this module only keeps files.
"""

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_exp.run.distributed import is_main_process, wait_for_everyone
from grpo_exp.run_files import HELDOUT_ACCURACY as METRIC

BEST_CHECKPOINT_DIR = "checkpoint-best"
TOP_CHECKPOINTS_DIR = "checkpoint-top"  # eval.keep_top_k > 1: the runners-up, as step-<N>
BEST_FILE = "best.json"  # in each kept checkpoint: its step, and the metric it was chosen by with its value


@dataclass(frozen=True)
class Best:
    step: int
    value: float


def best_of(history: list[dict], metric: str = METRIC) -> Best | None:
    """The best logged value of `metric` (ties: the earlier step); None when none was logged. Pure."""
    best = None
    for line in history:
        value = line.get(metric)
        if value is not None and value == value and (best is None or value > best.value):  # NaN never wins
            best = Best(int(line["step"]), float(value))
    return best


def ranked(kept: list[Best], candidate: Best, k: int) -> list[Best]:
    """The best k of the kept validations and a candidate, best first (ties: the earlier step). Pure."""
    return sorted([*kept, candidate], key=lambda best: (-best.value, best.step))[:k]


def carry_best(previous_run: Path, run_dir: Path, up_to_step: int) -> None:
    """A resumed run's kept checkpoints: the previous attempt's that were chosen at or before the step the run
    resumes from (later steps are trained, and validated, again)."""
    if previous_run.resolve() == run_dir.resolve():
        return
    for source in kept_checkpoints(previous_run):
        if json.loads((source / BEST_FILE).read_text())["step"] <= up_to_step:
            shutil.copytree(source, run_dir / source.relative_to(previous_run), dirs_exist_ok=True)


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """The validated checkpoints a run keeps: checkpoint-best, then checkpoint-top/step-<N>."""
    candidates = [run_dir / BEST_CHECKPOINT_DIR, *sorted((run_dir / TOP_CHECKPOINTS_DIR).glob("step-*"))]
    return [path for path in candidates if (path / BEST_FILE).is_file()]


class KeptModels:
    """The `keep_top_k` best validations by `metric` keep their model: `save(directory)` runs on every process when
    a validation enters them (DeepSpeed gathers its shards there), the main process alone moves and removes files."""

    def __init__(self, run_dir: Path, save: Callable[[Path], None], metric: str = METRIC, keep_top_k: int = 1):
        self.run_dir, self.save, self.metric, self.keep_top_k = run_dir, save, metric, keep_top_k
        self.kept: list[Best] = []  # best first

    @property
    def best(self) -> Best | None:
        return self.kept[0] if self.kept else None

    def offer(self, step: int, metrics: dict[str, float]) -> None:
        """A validation's model kept when it is among the keep_top_k best so far (NaN never enters)."""
        value = metrics.get(self.metric, float("nan"))
        if value != value:
            return
        candidate = Best(step, value)
        kept = ranked(self.kept, candidate, self.keep_top_k)
        if candidate not in kept:
            return
        if is_main_process():  # make room: the dropped go, a dethroned best becomes a runner-up
            for dropped in (best for best in self.kept if best not in kept):
                shutil.rmtree(self.location(dropped), ignore_errors=True)
            if kept[0] == candidate and self.best in kept:
                _move(self.run_dir / BEST_CHECKPOINT_DIR, self._runner_up_dir(self.best.step))
        wait_for_everyone()  # before any process writes the model
        self.kept = kept
        directory = self.location(candidate)
        self.save(directory)
        if is_main_process():
            record = {"step": step, "metric": self.metric, "value": value, METRIC: metrics[METRIC]}
            (directory / BEST_FILE).write_text(json.dumps(record))

    def resume(self, step: int, validations: list[tuple[int, dict[str, float]]]) -> None:
        """The kept models a resumed run carried, ranked by their `validations`; those of steps after `step`
        (trained again now) dropped; the best in checkpoint-best."""
        found, stale = {}, []
        for path in kept_checkpoints(self.run_dir):
            at = json.loads((path / BEST_FILE).read_text())["step"]
            value = next((m.get(self.metric) for s, m in validations if s == at), None)
            if at <= step and value is not None and value == value:
                found[Best(at, value)] = path
            else:
                stale.append(path)
        self.kept = sorted(found, key=lambda best: (-best.value, best.step))[: self.keep_top_k]
        wait_for_everyone()  # every process has read what was kept before the main process changes it
        if is_main_process():
            for path in stale:
                shutil.rmtree(path, ignore_errors=True)
            for best, path in found.items():
                if best not in self.kept:
                    shutil.rmtree(path, ignore_errors=True)
            best_dir = self.run_dir / BEST_CHECKPOINT_DIR
            if self.kept and found[self.kept[0]] != best_dir:  # another metric ranked it
                holder = next((b for b, path in found.items() if path == best_dir), None)
                if holder in self.kept:
                    _move(best_dir, self._runner_up_dir(holder.step))
                _move(found[self.kept[0]], best_dir)
        wait_for_everyone()

    def location(self, best: Best) -> Path:
        return self.run_dir / BEST_CHECKPOINT_DIR if best == self.best else self._runner_up_dir(best.step)

    def summary(self) -> dict:
        """For summary.json: checkpoint-best, and with keep_top_k > 1 every kept model."""
        if self.best is None:
            return {}
        summary = {"checkpoint_best": str(self.run_dir / BEST_CHECKPOINT_DIR)}
        if self.keep_top_k > 1:
            summary["top_k"] = [
                {"step": best.step, "value": best.value, "checkpoint": str(self.location(best))} for best in self.kept
            ]
        return summary

    def _runner_up_dir(self, step: int) -> Path:
        return self.run_dir / TOP_CHECKPOINTS_DIR / f"step-{step}"


def _move(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
