"""The probe's scoring: the battery of each held-out problem (attacks.py) scored by the run's own reward functions,
called as TRL calls them (prompts, completions, completion_ids, the dataset's columns), and by the weighted mix as
TRL sums it (a component's None left out); then the findings (findings.py) of each component and of the mix."""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.plugins import call_user, import_callable
from grpo_exp.probe.attacks import RIGHT, Problem, battery, final_answer_style, wrong_answer
from grpo_exp.probe.findings import Finding, findings
from grpo_exp.rewards.custom import checked_rewards
from grpo_exp.schema import AlarmAction, RolloutName
from grpo_exp.text import completion_text

MIX = "mix"  # the weighted sum of the components, as TRL trains on it
PROBE_FILE = "probe.json"


@dataclass
class ProbeResult:
    scores: dict[str, dict[str, list[float | None]]]  # reward (each component, MIX) -> kind -> per problem
    examples: dict[str, str]  # kind -> the first problem's completion of that kind
    found: list[Finding]
    right_credited: float  # the share of problems whose right answer the run's labels call correct

    @property
    def problems(self) -> int:
        return len(self.scores[MIX][RIGHT])

    def mean(self, reward: str, kind: str) -> float | None:
        values = [v for v in self.scores[reward][kind] if v is not None]
        return sum(values) / len(values) if values else None

    def record(self) -> dict:
        kinds = list(self.examples)
        means = {reward: {kind: self.mean(reward, kind) for kind in kinds} for reward in self.scores}
        return {
            "problems": self.problems,
            "right_credited_by_labels": self.right_credited,
            "findings": [finding.row() for finding in self.found],
            "means": means,
            "examples": self.examples,
        }

    def write(self, directory: Path) -> Path:
        path = directory / PROBE_FILE
        path.write_text(json.dumps(self.record(), indent=2) + "\n", encoding="utf-8")
        return path


def user_attacks(paths: list[str]) -> dict[str, Callable[[Problem], str]]:
    """probe.attacks: the user's own, each f(problem: Problem) -> str by import path, named by its function; what
    it raises, or returns other than text, is one message naming it."""
    attacks = {}
    for path in paths:
        func = import_callable(path, "probe.attacks", "an attack: f(problem: Problem) -> str")
        name = path.rpartition(":")[2]
        attacks[name] = functools.partial(_checked_attack, func, name)
    return attacks


def _checked_attack(func: Callable[[Problem], str], name: str, problem: Problem) -> str:
    text = call_user(func, f"probe.attacks: {name}", problem)
    if not isinstance(text, str):
        raise UserError(f"probe.attacks: {name} returned a {type(text).__name__}: an attack returns the text")
    return text


def probe(reward_funcs: list[Callable], weights: list[float], rows: list[dict], tokenizer, labels, extra=None):
    """The battery of every row (a held-out problem: prompt, solution and the dataset's other columns), scored."""
    style = final_answer_style(labels.answer_rule)
    references = [str(row["solution"]) for row in rows]
    problems = [
        Problem(_question(row), ref, wrong_answer(ref, references[i + 1 :] + references[:i]), style)
        for i, (row, ref) in enumerate(zip(rows, references, strict=True))
    ]
    batteries = [battery(problem, extra) for problem in problems]
    kinds = list(batteries[0])
    scores = {func.__name__: {} for func in reward_funcs} | {MIX: {}}
    for kind in kinds:
        texts = [completions[kind] for completions in batteries]
        per_component = [score_texts(func, rows, texts, tokenizer) for func in reward_funcs]
        for func, values in zip(reward_funcs, per_component, strict=True):
            scores[func.__name__][kind] = values
        scores[MIX][kind] = [weighted_total(values, weights) for values in zip(*per_component, strict=True)]
    examples = {kind: batteries[0][kind] for kind in kinds}
    found = [finding for reward, by_kind in scores.items() for finding in findings(reward, by_kind, examples)]
    right = labels([b[RIGHT] for b in batteries], references, [row.get("task_entry") for row in rows])
    return ProbeResult(scores, examples, found, sum(1 for label in right if label) / len(rows))


def _question(row: dict) -> str:
    prompt = row["prompt"]
    if isinstance(prompt, list):  # conversational: the last user turn
        return next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), "")
    return str(prompt)


def score_texts(func: Callable, rows: list[dict], texts: list[str], tokenizer) -> list[float | None]:
    """As TRL calls a reward function: the prompts, the completions in the prompts' format, their token ids, and
    every other column of the dataset, one value per completion."""
    prompts = [row["prompt"] for row in rows]
    conversational = isinstance(prompts[0], list)
    completions = [[{"role": "assistant", "content": text}] if conversational else text for text in texts]
    ids = [tokenizer(completion_text(c), add_special_tokens=False)["input_ids"] for c in completions]
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    rewards = func(
        prompts=prompts,
        completions=completions,
        completion_ids=ids,
        trainer_state=None,
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
        **columns,
    )
    return checked_rewards(func.__name__, "probe", rewards, len(texts))


def weighted_total(values: tuple[float | None, ...], weights: list[float]) -> float | None:
    """TRL's sum of the weighted components, a None one left out; None when all are."""
    present = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
    return sum(v * w for v, w in present) if present else None


def probe_heldout(reward_funcs, weights, heldout, tokenizer, labels, probe_cfg) -> ProbeResult:
    """probe.*: the first probe.problems held-out problems, the built-in attacks and the user's (probe.attacks)."""
    count = min(probe_cfg.problems, len(heldout))
    rows = [heldout[i] for i in range(count)]
    return probe(reward_funcs, weights, rows, tokenizer, labels, user_attacks(list(probe_cfg.attacks)))


def finding_lines(result: ProbeResult) -> list[str]:
    """One line per finding, for the log and the summary."""
    return [
        f"{f.reward}: '{f.attack}' pays {f.kind} ({f.attack_mean:.3f} against right {f.right_mean:.3f}, wrong "
        f"{f.wrong_mean:.3f}, {f.problems} problems)"
        for f in result.found
    ]


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("probe.problems",),
        lambda cfg: (
            cfg.probe.before_training is not AlarmAction.off
            or (
                cfg.probe.labels_check is not AlarmAction.off
                and not cfg.eval.before
                and cfg.rollout.name is RolloutName.single
            )
        ),
        "by the reward probe and, single-turn without eval.before, the labels check",
        lambda cfg: "probe.before_training=off" + ("" if cfg.eval.before else " and probe.labels_check=off"),
        "set probe.before_training=warn or stop (or run grpo-exp probe)",
    ),
    OnlyWith(
        ("probe.attacks",),
        lambda cfg: cfg.probe.before_training is not AlarmAction.off,
        "by the reward probe: `grpo-exp probe`, or before a run with probe.before_training",
        lambda cfg: "probe.before_training=off",
        "set probe.before_training=warn or stop (or run grpo-exp probe)",
    ),
)
