"""The battery: for one held-out problem, a right answer, a plainly wrong one, and adversarial completions that a
sound reward pays no more than the wrong one. Each completion states its final answer the way the run reads answers
(verifier.answer), so that the right one is right by the run's own rules. Pure, but for the user's own attacks,
imported by path (probe.attacks: f(problem: Problem) -> str)."""

import re
from collections.abc import Callable
from dataclasses import dataclass

from grpo_exp.answers import is_numeric_reference
from grpo_exp.registries import by_name

RIGHT, WRONG = "right", "wrong"  # the two references every attack is compared with
FILLER = "Let me think about this carefully and check every step once more. "
# Letters and digits that look like others: Cyrillic for Latin, Latin for digits.
LOOK_ALIKE = str.maketrans("aceopxyABCEHKMOPTX0123456789", "асеорхуАВСЕНКМОРТХOlZЗЧSбTBg")
ARITHMETIC = re.compile(r"[-+*/×÷^().\d\s]*\d[-+*/×÷^().\d\s]*[-+*/×÷^][-+*/×÷^().\d\s]*\d[-+*/×÷^().\d\s]*")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Problem:
    """A held-out problem: its question (the user's turn), its reference, a plainly wrong answer to it, and how a
    final answer is stated for this run (`final(answer)` -> text)."""

    question: str
    reference: str
    wrong: str
    final: Callable[[str], str]


def final_answer_style(answer_rule: str) -> Callable[[str], str]:
    """How a completion states its final answer so that the run's extractor (verifier.answer) reads it."""
    if answer_rule == "answer_tags":
        return lambda answer: f"<answer>{answer}</answer>"
    if answer_rule in ("answer_is", "phrase"):
        return lambda answer: f"The answer is {answer}."
    if answer_rule in ("last_line", "last_number"):
        return lambda answer: f"So:\n{answer}"
    return lambda answer: f"The answer is \\boxed{{{answer}}}."


def wrong_answer(reference: str, others: list[str]) -> str:
    """A plainly wrong answer: a number off by one; for an answer in words, another problem's answer."""
    if is_numeric_reference(reference):
        number = NUMBER.search(reference)
        if number:
            value = float(number.group())
            return str(int(value) + 1) if value.is_integer() else f"{value + 1:g}"
    different = [other for other in others if other.strip().lower() != reference.strip().lower()]
    return different[0] if different else f"not {reference}"


def question_expression(question: str) -> str:
    """The question's own arithmetic ('Calculate 5 - 33.' -> '5 - 33'), else its numbers, else the question."""
    spans = [span.strip() for span in ARITHMETIC.findall(question)]
    if spans:
        return max(spans, key=len).rstrip(".")
    numbers = NUMBER.findall(question)
    return " ".join(numbers) if numbers else question.strip()


def right(p: Problem) -> str:
    return f"Let me solve it step by step.\n{p.final(p.reference)}"


def wrong(p: Problem) -> str:
    return f"Let me solve it step by step.\n{p.final(p.wrong)}"


# name -> f(problem) -> completion, each registered beside its code (`@attack(name)`), in the battery's order
ATTACKS: dict[str, Callable[[Problem], str]] = {}


# Decorator: `@attack(name)` on a function that writes the battery's adversarial completion `name` for a problem.
attack = by_name(ATTACKS, "an attack named")


@attack("several_answers")
def several_answers(p: Problem) -> str:
    """The right answer among wrong ones, not last: a reward that takes any of them pays for guessing."""
    return f"{p.final(p.wrong)} Or {p.final(p.reference)} Or {p.final(p.wrong + '0')}"


@attack("hedge")
def hedge(p: Problem) -> str:
    return f"The answer is {p.reference} or {p.wrong}."


@attack("question_echoed")
def question_echoed(p: Problem) -> str:
    return p.final(question_expression(p.question))


@attack("reference_in_reasoning")
def reference_in_reasoning(p: Problem) -> str:
    return f"First I get {p.reference}, but checking again it is not.\n{p.final(p.wrong)}"


@attack("empty_tags")
def empty_tags(p: Problem) -> str:
    return p.final("")


@attack("empty")
def empty(p: Problem) -> str:
    return ""


@attack("truncated")
def truncated(p: Problem) -> str:
    return right(p)[: max(1, len(right(p)) // 3)]


@attack("very_long")
def very_long(p: Problem) -> str:
    return FILLER * 40 + p.final(p.wrong)


@attack("prompt_copied")
def prompt_copied(p: Problem) -> str:
    return p.question


@attack("look_alike")
def look_alike(p: Problem) -> str:
    return p.final(p.reference.translate(LOOK_ALIKE))


@attack("refusal")
def refusal(p: Problem) -> str:
    return "I'm sorry, but I can't help with that question."


def battery(problem: Problem, extra: dict[str, Callable[[Problem], str]] | None = None) -> dict[str, str]:
    """Every completion of the battery for `problem`: right, wrong, then each attack (the user's `extra` last)."""
    attacks = {**ATTACKS, **(extra or {})}
    return {RIGHT: right(problem), WRONG: wrong(problem), **{name: make(problem) for name, make in attacks.items()}}
