"""Why a run did (not) learn: findings from the run's own records (grpo_exp.analysis.diagnosis.rules), at the end of
every run (summary.json's `diagnosis`, the printed summary), and from any run directory (`grpo-exp diagnose`)."""

import dataclasses

from grpo_exp.analysis.diagnosis.evidence import RunEvidence, is_run_dir, read_run
from grpo_exp.analysis.diagnosis.rules import EXPLAINS_HELDOUT, RULES, Finding, no_change

HEALTHY = "no finding: nothing in the run's records says it went wrong"

__all__ = ["HEALTHY", "Finding", "RunEvidence", "diagnose", "is_run_dir", "read_run"]


def diagnose(evidence: RunEvidence) -> list[Finding]:
    """Every rule's finding, in the order a user should act on them (the labels first: a misread answer explains the
    rest)."""
    found = [not_yet_tried(finding, evidence) for rule in RULES if (finding := rule(evidence)) is not None]
    if not EXPLAINS_HELDOUT & {finding.name for finding in found}:  # a held-out result no other finding accounts for
        change = no_change(evidence, explained=bool(found))
        found += [change] if change is not None else []
    return found


def diagnosis_lines(findings: list[Finding]) -> list[str]:
    return [line for finding in findings for line in finding.lines()] or [HEALTHY]


def not_yet_tried(finding: Finding, evidence: RunEvidence) -> Finding:
    """The finding without the settings to try that the run already has (trainer.beta=0.04 on a run with beta 0.04)."""

    def already(tried: str) -> bool:
        key, _, value = tried.split()[0].partition("=")
        have = evidence.setting(key)
        return bool(value) and have is not None and str(have) == value.strip("'\"")

    return dataclasses.replace(finding, tries=tuple(t for t in finding.tries if not already(t)))
