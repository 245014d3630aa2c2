"""Text helpers shared by rewards, verifiers and statistics: a prompt's question, a completion's text, the
\\boxed{} answer, the stated final answer."""

import re

BOXED = "\\boxed{"
LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
LATEX_SPAN = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$(.+?)\$", re.DOTALL)


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
    """The completion's final answer: its last \\boxed{} content, else what it writes last: a number, or a
    LaTeX math span (its right-hand side after the last '=': "$$5 + 3 = \\frac{16}{2}$$" gives \\frac{16}{2}).

    Not math-verify's anchored extraction: "the final answer ... the expression 5 - 33." would be taken as
    the answer and evaluated to the right value, a hack the embedded model found in 40 steps.
    """
    boxed = boxed_content(text)
    if boxed is not None:
        return boxed.strip()
    numbers = list(LAST_NUMBER.finditer(text))
    spans = list(LATEX_SPAN.finditer(text))
    if spans and (not numbers or spans[-1].end() >= numbers[-1].end()):
        content = next(group for group in spans[-1].groups() if group is not None)
        return content.rsplit("=", 1)[-1].strip()
    return numbers[-1].group().replace(",", "") if numbers else None


def prompt_text(prompt) -> str:
    """The question a response answers: the last user message of a chat prompt (or the prompt string)."""
    if isinstance(prompt, str):
        return prompt
    return next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")


def tokens_covering(ids: list[int], text: str, end: int, decode) -> int:
    """How many of the leading token `ids` wrote `text[:end]`, where `text` is `decode(ids)`: the shortest prefix
    whose decoded text starts with it (a character split over tokens decodes to a placeholder until its last
    token, so a prefix is only trusted once it reads the same). All of them when none does."""
    for count in range(1, len(ids) + 1):
        prefix = decode(ids[:count])
        if len(prefix) >= end and prefix[:end] == text[:end]:
            return count
    return len(ids)
