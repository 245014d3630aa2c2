"""probe.labels_check: before the first step, the untrained policy's greedy answers (those measured before training,
else, single-turn, the first probe.problems held-out problems; not for environments, which score themselves) read
with the run's labels beside the lenient content check (the reference anywhere in the final sentence), and scored by
the run's reward.

Two findings, warned (logged, `labels_check` in summary.json) or stopped on, before any step is spent:
- the labels misread the task: many answers state the reference yet are labelled wrong (the diagnosis rule
  labels_misread, with three examples and the rule that would read them);
- every answer scores alike: one reward value for every answer, so no group can have a spread unless sampling
  finds answers that score otherwise (task_score's 0.01 for any wrong answer).
"""

import logging
from pathlib import Path

from grpo_exp.analysis.diagnosis.evidence import RunEvidence
from grpo_exp.analysis.diagnosis.rules import Finding, easier_settings, labels_misread
from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.probe.battery import score_texts, weighted_total
from grpo_exp.rewards.components import graded_components
from grpo_exp.run.heldout import run_heldout_accuracy
from grpo_exp.schema import AlarmAction

log = logging.getLogger("grpo_exp.train")
ALIKE_ANSWERS = 32  # the answers the reward scores (rules: milliseconds; a user's component may cost more)


def answers_alike(rewards: list[float | None], reward: str, evidence: RunEvidence) -> Finding | None:
    """Every scored answer got one and the same reward (at least 5 of them). Pure."""
    scored = [r for r in rewards if r is not None]
    if len(scored) < 5 or max(scored) - min(scored) > 1e-9:
        return None
    return Finding(
        "answers_alike",
        f"every one of the {len(scored)} answers of the untrained policy scored {scored[0]:.3g} by the reward "
        f"({reward})",
        "GRPO learns from differences within a group: unless sampling finds answers that score otherwise, no group "
        "has a spread and nothing is learned",
        tuple(easier_settings(evidence)),
    )


def check_labels_first(evaluation, model, run_dir: Path) -> list[str] | None:
    """The findings (lines), None with probe.labels_check=off; every process alike (the answers are gathered)."""
    spec, parts = evaluation.spec, evaluation.parts
    action = AlarmAction(spec.cfg.probe.labels_check)
    if action is AlarmAction.off:
        return None
    if spec.multiturn and spec.cfg.rollout.environment is not None:
        return None  # an environment scores its episodes itself: no labels to misread
    if evaluation.before is not None:
        samples = evaluation.before.samples
    elif spec.multiturn:  # whole rollouts before training, which eval.before=false chose not to spend
        log.info("Labels check skipped: a multi-turn run checks the answers of eval.before, which is off")
        return None
    else:
        count = min(spec.cfg.probe.problems, len(evaluation.heldout))
        problems = evaluation.heldout.select(range(count))
        samples = run_heldout_accuracy(model, evaluation.tokenizer, problems, spec, parts, "labels check").samples
    evidence = RunEvidence(config=spec.saved_config, summary={"answer": parts.verifier.answer_rule})
    findings = [labels_misread(evidence, samples)]
    if parts.rollout is None and not spec.native_tool_calling:
        findings.append(_alike(samples, evaluation, evidence))
    lines = [line for finding in findings if finding is not None for line in finding.lines()]
    if not lines:
        log.info(
            "Labels check: the labels and the content check agree on %d answers of the untrained policy", len(samples)
        )
        return []
    shown = "\n".join(lines)
    log.warning("Labels check, before training (`grpo-exp diagnose %s` shows it again):\n%s", run_dir, shown)
    if action is AlarmAction.stop:
        raise UserError(f"probe.labels_check=stop: before training,\n{shown}")
    return lines


def _alike(samples: list[dict], evaluation, evidence: RunEvidence) -> Finding | None:
    """The run's reward on the answers; not with a learned component in the mix (a judge's or a verifier's graded
    score): its scores rarely tie, and asking it here costs its calls."""
    funcs = evaluation.parts.reward_funcs
    if not samples or any(f.__name__ in graded_components() for f in funcs):
        return None
    weights = evaluation.spec.reward_weights
    by_question = {row["question"]: row for row in evaluation.heldout}
    samples = [s for s in samples[:ALIKE_ANSWERS] if s.get("question") in by_question]
    if not samples:
        return None
    rows = [by_question[s["question"]] for s in samples]
    texts = [s["completion"] for s in samples]
    per_component = [score_texts(f, rows, texts, evaluation.tokenizer) for f in funcs]
    totals = [weighted_total(values, weights) for values in zip(*per_component, strict=True)]
    return answers_alike(
        totals, " + ".join(f"{w:g}*{f.__name__}" for f, w in zip(funcs, weights, strict=True)), evidence
    )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("probe.labels_check",),
        lambda cfg: cfg.rollout.environment is None or cfg.probe.labels_check is not AlarmAction.stop,
        "where answers are read by labels (an environment scores its episodes itself)",
        lambda cfg: "this run's rollout.environment scores them",
        "leave the default (warn), which an environment skips",
    ),
)
