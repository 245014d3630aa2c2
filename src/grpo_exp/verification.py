"""Verifiers: who decides whether an answer is correct (held-out accuracy; later, self-verification labels)."""

from collections.abc import Callable

from grpo_exp.errors import UserError
from grpo_exp.rewards.math import answer_score

Verifier = Callable[[list[str], list[str]], list[bool | None]]


def math_verify_verifier() -> Verifier:
    """Rule-based: math-verify equivalence of the final answer with the reference (None: unparseable reference)."""

    def verify(texts: list[str], solutions: list[str]) -> list[bool | None]:
        scores = [answer_score(t, s) for t, s in zip(texts, solutions, strict=True)]
        return [None if s is None else s >= 0.5 for s in scores]

    return verify


VERIFIERS: dict[str, Callable[[], Verifier]] = {"math_verify": math_verify_verifier}


def build_verifier(name: str) -> Verifier:
    if name not in VERIFIERS:
        raise UserError(f"verifier='{name}' is unknown; known verifiers: {sorted(VERIFIERS)}")
    return VERIFIERS[name]()
