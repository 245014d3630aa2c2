"""The verification benchmark: can a model tell its own correct answers from its wrong ones?

A fixed, balanced set (eval.verification_benchmark): the initial policy's own sampled answers to problems it
never trains on, labelled by the run's labels (verifier.labels), as many correct as incorrect (at most
`per_problem` per problem), built once and cached with its seed. A model is scored on it by its P(Yes) to "Is the
proposed answer correct?" (one forward pass each): AUROC with a bootstrap interval, balanced accuracy and the share of
"Yes" verdicts at P(Yes) > 0.5, Brier score and ECE. A constant verdict scores AUROC 0.5 and balanced accuracy
0.5, whatever it is, so a drift towards "Yes" cannot pass for verification ability.
"""

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from grpo_exp.config_rules import OnlyWith
from grpo_exp.generation import PolicyAnswers
from grpo_exp.measures import auroc, balanced_accuracy, bootstrap_interval
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.p_yes import policy_p_yes
from grpo_exp.verification.selfverify import (
    Candidate,
    balanced_set,
    brier,
    candidates_from_groups,
    expected_calibration_error,
    filter_candidates,
    shown_answer,
)
from grpo_exp.verification.task_score import entries_of

log = logging.getLogger(__name__)
PREFIX = "verify_bench"


def benchmark_key(
    bench_cfg: DictConfig,
    model_cfg: DictConfig,
    data_cfg: DictConfig,
    max_new_tokens: int,
    labels: str = "math_verify",
    answer_rule: str = "stated",
) -> str:
    """What the set depends on: the answering model, the problems, the sampling, the selection, the labels
    (verifier.labels) and the answer extractor's rule (verifier.answer, resolved). Settings at their defaults that
    were added later (a dataset function, the labels, the extractor) are left out, so that the sets cached before
    them keep their keys."""
    dataset = OmegaConf.to_container(data_cfg, resolve=True)
    for key, unset in (("function", None), ("function_args", {})):
        if dataset.get(key, unset) == unset:
            dataset.pop(key, None)
    identity = {
        "model": OmegaConf.to_container(model_cfg, resolve=True),
        "dataset": dataset,
        "benchmark": {k: v for k, v in OmegaConf.to_container(bench_cfg).items() if k not in ("enabled", "resamples")},
        "max_new_tokens": max_new_tokens,
    }
    if labels != "math_verify":
        identity["labels"] = labels
    if answer_rule != "stated":
        identity["answer"] = answer_rule
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_benchmark(
    answers: PolicyAnswers, problems: Dataset, verifier: Labels, bench_cfg: DictConfig
) -> list[Candidate]:
    """Sample the policy's answers to the problems (as the run answers: `answers`), label them, and draw the
    balanced set."""
    torch.manual_seed(bench_cfg.seed)
    samples = bench_cfg.samples
    prompts = [p for p in problems["prompt"] for _ in range(samples)]
    texts = answers(prompts, bench_cfg.temperature, "verification benchmark: answers")
    labels = verifier(texts, [s for s in problems["solution"] for _ in range(samples)], entries_of(problems, samples))
    candidates = candidates_from_groups(problems["question"], texts, labels, samples, verifier.answer)
    kept, _ = filter_candidates(candidates, drop_no_answer=True, drop_all_wrong=False)
    chosen = balanced_set(kept, bench_cfg.per_label, bench_cfg.per_problem, bench_cfg.seed)
    if len(chosen) < 2 * bench_cfg.per_label:
        right = [c for c in kept if c.correct]
        log.warning(
            "verification benchmark: %d correct and %d incorrect answers (asked for %d each): of %d sampled "
            "answers %d were right, on %d problems; raise eval.verification_benchmark.problems or .samples, or "
            "lower .temperature",
            len(chosen) // 2,
            len(chosen) // 2,
            bench_cfg.per_label,
            len(texts),
            len(right),
            len({c.problem for c in right}),
        )
    return chosen


def save_benchmark(examples: list[Candidate], path: Path) -> None:
    """Written whole or not at all (a temporary file renamed), so that an interrupted build is never reused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps([dataclasses.asdict(c) for c in examples]), encoding="utf-8")
    partial.replace(path)


def load_benchmark(path: Path) -> list[Candidate]:
    return [Candidate(**row) for row in json.loads(path.read_text(encoding="utf-8"))]


def benchmark_metrics(p_yes: list[float], correct: list[bool], resamples: int, seed: int) -> dict[str, float]:
    """The measures of a P(Yes) on the benchmark; the 95% percentile-bootstrap intervals of the AUROC and of the
    balanced accuracy beside them."""
    low, high = bootstrap_interval(p_yes, correct, auroc, resamples, seed=seed)
    balanced_low, balanced_high = bootstrap_interval(p_yes, correct, _balanced_accuracy, resamples, seed=seed)
    says_yes = [p > 0.5 for p in p_yes]
    return {
        f"{PREFIX}/examples": float(len(p_yes)),
        f"{PREFIX}/auroc": auroc(p_yes, correct),
        f"{PREFIX}/auroc_low": low,
        f"{PREFIX}/auroc_high": high,
        f"{PREFIX}/balanced_accuracy": balanced_accuracy(says_yes, correct),
        f"{PREFIX}/balanced_accuracy_low": balanced_low,
        f"{PREFIX}/balanced_accuracy_high": balanced_high,
        f"{PREFIX}/yes_rate": sum(says_yes) / len(says_yes),
        f"{PREFIX}/brier": brier(p_yes, correct),
        f"{PREFIX}/ece": expected_calibration_error(p_yes, correct),
    }


def _balanced_accuracy(p_yes: list[float], correct: list[bool]) -> float:
    return balanced_accuracy([p > 0.5 for p in p_yes], correct)


def score_benchmark(model, tokenizer, examples: list[Candidate], bench_cfg: DictConfig, batch_size: int) -> dict:
    """These weights' own P(Yes) on the benchmark, asked with its question."""
    if not examples:
        return {}
    scorer = policy_p_yes(model, tokenizer, batch_size, bench_cfg.template)
    p_yes = scorer([c.question for c in examples], [shown_answer(c) for c in examples])
    return benchmark_metrics(p_yes, [c.correct for c in examples], bench_cfg.resamples, bench_cfg.seed)


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("eval.verification_benchmark",),
        lambda cfg: cfg.eval.verification_benchmark.enabled,
        "by the verification benchmark (eval.verification_benchmark.enabled=true)",
        lambda cfg: "eval.verification_benchmark.enabled=false",
        "set eval.verification_benchmark.enabled=true too",
        but=("eval.verification_benchmark.enabled",),
    ),
)
