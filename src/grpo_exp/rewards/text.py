"""Helpers shared by the reward components: completion text, the \\boxed{} answer, the stated final answer."""

import re

BOXED = "\\boxed{"
LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(completion) -> str:
    """TRL passes a string (standard format) or a list of messages (conversational); we score the last message."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


def last_boxed_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the last \\boxed{...} with balanced braces, or None.

    Linear time whatever the input: a candidate still open where the next candidate starts can never
    close (the later one did not), so each candidate scans only up to the next one.
    """
    limit = len(text)
    start = text.rfind(BOXED)
    while start != -1:
        depth, index = 1, start + len(BOXED)
        while index < limit and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth == 0:
            return start, index
        limit = start
        start = text.rfind(BOXED, 0, start)
    return None


def boxed_content(text: str) -> str | None:
    span = last_boxed_span(text)
    return None if span is None else text[span[0] + len(BOXED) : span[1] - 1]


def stated_answer(text: str) -> str | None:
    """The completion's final answer: its last \\boxed{} content, else the last number it writes.

    The last number, not math-verify's anchored extraction: "the final answer ... the expression 5 - 33."
    would be taken as the answer and evaluated to the right value, a hack the embedded model found in 40 steps.
    """
    boxed = boxed_content(text)
    if boxed is not None:
        return boxed.strip()
    numbers = LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None
