"""The rule verifier: math-verify equivalence of a completion's final answer with the reference.

It gives the `math` reward and, with verifier.labels=math_verify (the default), the run's correctness labels:
held-out accuracy, group statistics, the labels of the self-verification task (grpo_exp.verification.labels). The
final answer is read by the run's extractor (verifier.answer, grpo_exp.answers: for numbers, the last \\boxed{}
content, else what is written last); an answer that restates the arithmetic ('\\boxed{5 - 33}') scores 0.
"""

import functools
import logging
import re
from collections.abc import Callable

from grpo_exp.answers import AnswerExtractor
from grpo_exp.text import BOXED, stated_answer
from grpo_exp.verification.cpu_time_limit import call_within_cpu_time

# (texts, references, entries=None: each reasoning-gym entry, for task_score) -> True / False / None each
Verifier = Callable[..., list[bool | None]]

# Two numbers joined by + - * × · ÷ \times \cdot \div: unevaluated arithmetic, not a value (3/4 is a fraction).
UNEVALUATED = re.compile(r"\d\s*(?:[-+*×·÷]|\\times|\\cdot|\\div)\s*\(?\s*-?\s*\d")
# The final answer lives at the end; a bounded tail keeps parsing time bounded on huge completions.
TAIL_CHARS = 4000
# CPU seconds of this thread per parse and per verification (cpu_time_limit: not the wall clock, so a busy machine
# does not turn a right answer into 0). A real answer takes milliseconds; a power tower or (10^10)! hits the limit
# and scores 0 (see `make bench` for the worst case).
TIMEOUT_SECONDS = 2
# A timeout is an expected outcome here (the answer scores 0), not a warning for every such completion; math-verify
# also warns, once, that its own (wall-clock) timeouts are off, which they are in favour of ours.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)


@functools.cache
def _boxed_only() -> list:
    """math-verify's extraction of a \\boxed{} answer only (math-verify and sympy: imported when an answer is first
    parsed, not where the labels are only named, as by --help and --cfg)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig

    return [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
    ]


@functools.lru_cache(maxsize=4096)
def parse_reference(reference: str) -> list:
    """Cached: the G completions of a group share one reference."""
    from math_verify import parse

    return call_within_cpu_time(lambda: parse(str(reference), parsing_timeout=None), TIMEOUT_SECONDS, timed_out=[])


def answer_score(text: str, reference: str, extract: AnswerExtractor = stated_answer) -> float | None:
    """1.0 if the answer (`extract`: the run's extractor, verifier.answer) equals the reference, 0.0 if not, None if
    the reference cannot be parsed."""
    gold = parse_reference(reference)
    if not gold:
        return None
    answer = extract(text[-TAIL_CHARS:])
    if answer is None or UNEVALUATED.search(answer):
        return 0.0
    from math_verify import parse, verify

    parsed = call_within_cpu_time(
        lambda: parse(BOXED + answer + "}", extraction_config=_boxed_only(), parsing_timeout=None),
        TIMEOUT_SECONDS,
        timed_out=[],
    )
    return float(call_within_cpu_time(lambda: verify(gold, parsed, timeout_seconds=None), TIMEOUT_SECONDS, False))
