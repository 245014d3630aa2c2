"""Math accuracy with math-verify: the completion's final answer against the reference.

The final answer is the last \\boxed{} content, else the last number written ('... so 3 + 4 = 7',
'#### 72'); math-verify then decides equivalence (fractions, LaTeX, units). An answer that is the
arithmetic itself ('\\boxed{5 - 33}' for -28) scores 0: restating the question is not solving it.
TRL's `accuracy_reward` is not used because it accepts LaTeX-anchored answers only, which would score a
plain '7' as wrong.
"""

import functools
import logging
import re
import threading

from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify

from grpo_exp.rewards.text import BOXED, completion_text, stated_answer

BOXED_ONLY = [
    LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
    )
]
# Two numbers joined by + - * × · ÷ \times \cdot \div: unevaluated arithmetic, not a value (3/4 is a fraction).
UNEVALUATED = re.compile(r"\d\s*(?:[-+*×·÷]|\\times|\\cdot|\\div)\s*\(?\s*-?\s*\d")
# The final answer lives at the end; a bounded tail keeps parsing time bounded on huge completions.
TAIL_CHARS = 4000
# Per parse and per comparison. A real answer takes milliseconds; a power tower or (10^10)! hits the limit
# and scores 0 (see `make bench` for the worst case).
TIMEOUT_SECONDS = 2
# A timeout is an expected outcome here (the answer scores 0), not a warning for every such completion.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def _timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread (where TRL calls
    # synchronous reward functions); elsewhere only the tail limit bounds the work.
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def parse_reference(reference: str) -> list:
    """Cached: the G completions of a group share one reference."""
    return parse(str(reference), parsing_timeout=_timeout())


def answer_score(text: str, reference: str) -> float | None:
    """1.0 if the answer equals the reference, 0.0 if not, None if the reference cannot be parsed."""
    gold = parse_reference(reference)
    if not gold:
        return None
    answer = stated_answer(text[-TAIL_CHARS:])
    if answer is None or UNEVALUATED.search(answer):
        return 0.0
    parsed = parse(BOXED + answer + "}", extraction_config=BOXED_ONLY, parsing_timeout=_timeout())
    return float(verify(gold, parsed, timeout_seconds=_timeout()))


def make_math_reward():
    def math(completions, solution, **kwargs) -> list[float | None]:
        """1.0 when the final answer equals the reference; None (skipped) for a missing or unparseable reference
        (verification prompts of the self-verification task have none)."""
        return [
            None if s is None else answer_score(completion_text(c), s)
            for c, s in zip(completions, solution, strict=True)
        ]

    return math
