"""Answer extractors: how a run reads a completion's final answer (`verifier.answer`).

One extractor per run, built once (grpo_exp.run.build) and read by everything that needs an answer: the labels
(math_verify, exact_match), the `math` reward, maj@k and distinct answers (training's group statistics and
held-out evaluation), self-verification's proposed answer, the P(Yes) prompt's `{answer}` and the sample tables.
An extractor is `f(text: str) -> str | None` (None: no answer could be read). Built in:

- stated: the last \\boxed{} content, else what is written last: a number, or a LaTeX span's right-hand side
  (grpo_exp.text.stated_answer; for mathematics);
- phrase: the last \\boxed{} content, else the last <answer>...</answer>, else what follows the last "the answer
  is" / "answer:", else the answer a final sentence states (`stated_in_sentence`: a bold **X**, a quoted final word
  or phrase, "... is X."), else the last line (for answers that are words, names, labels or phrases);
- boxed, answer_tags (reasoning-gym's format), answer_is, stated_in_sentence, last_line, last_number: one rule each;
- auto (the default): `stated` when the dataset's references are numbers, else `phrase` (grpo_exp.data decides).

Or the user's own function by import path, `verifier.answer=module:name`.
"""

import re
from collections.abc import Callable

from grpo_exp.errors import UserError
from grpo_exp.plugins import call_user, import_callable, signature_of
from grpo_exp.registries import by_name
from grpo_exp.text import LAST_NUMBER, boxed_content, stated_answer

AnswerExtractor = Callable[[str], str | None]
KEY = "verifier.answer"
AUTO = "auto"
CONVENTION = "an answer extractor is f(text: str) -> str | None (None: no answer in the text)"
# \text{Paris}, \textbf{...}, \mathrm{...}: the words inside.
TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "The answer is X.", "Final answer: X": X runs to the end of its sentence (or line).
ANSWER_IS = re.compile(r"\banswer\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s")
# How a model states a short answer in its final sentence (stated_in_sentence), the last of each kind:
BOLD = re.compile(r"\*\*([^*\n]+?)\*\*|__([^_\n]+?)__")  # **slow**
# A quoted word or phrase ending the sentence: 'The opposite of "fast" is "slow."', 'is 'slow'.' (a lone ' after a
# letter is an apostrophe, not a quote: "John's").
QUOTED_AT_END = re.compile(r"""(?:"|“|(?<![\w'])')([^"“”\n]{1,80}?)[.!]?(?:"|”|'(?!\w))\s*[.!]?\s*$""")
QUOTED_FIRST = re.compile(r"""["“]([^"“”\n]{1,80}?)[.!,]?["”]""")  # a quoted span opening what was said
# "... is X." / "... are X": X is what follows the first such verb from which at most 80 characters end the sentence.
# Not the last verb: on the embedded model's answers (benchmarks/answer_rules.py) that read one fewer opposite right
# ('... is "wife" or "wife" is a double negative.') and none more; "the country that is north of Spain is Paris"
# is misread instead.
IS_AT_END = re.compile(r"(?:^|\s)(?:is|are|was|were|would be|will be)\s+(?!not\b)(.{1,80}?)\s*[.!]?\s*$", re.I)
# What an "is X" answer opens with but is not the answer: "his aunt", "Alice's husband", "the word apple".
DETERMINER = re.compile(
    r"^(?:(?:the|a|an|his|her|their|its|my|your|our|this|that)\s+|(?:[A-Z]\w*)['’]s\s+|(?:word|answer)\s+)+",
    re.IGNORECASE,
)
# A leading number with its unit-free remainder: "42 apples" reads as 42 (numbers are compared by value).
NUMBER_REFERENCE = re.compile(r"\s*\$?-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?\$?\s*")
LATEX_REFERENCE = re.compile(r"\s*\\(?:frac|sqrt|dfrac|pi)\b.*|\s*\$.*\$\s*", re.DOTALL)


# name -> extractor, each registered beside its code (`@answer_rule(name)`), in the order the refusals list them
BUILT_IN: dict[str, AnswerExtractor] = {}


# Decorator: `@answer_rule(name)` makes the function the built-in answer rule `name` (verifier.answer=name).
answer_rule = by_name(BUILT_IN, "an answer rule named")


answer_rule("stated")(stated_answer)  # grpo_exp.text's: for mathematics


def _stripped(text: str | None) -> str | None:
    text = None if text is None else text.strip()
    return text or None


@answer_rule("phrase")
def phrase(text: str) -> str | None:
    """\\boxed{}, else <answer> tags, else "the answer is X", else the answer a final sentence states, else the last
    line: the first rule that finds one."""
    for rule in (boxed, answer_tags, answer_is, stated_in_sentence, last_line):
        answer = rule(text)
        if answer is not None:
            return answer
    return None


@answer_rule("boxed")
def boxed(text: str) -> str | None:
    """The last \\boxed{} content."""
    return _stripped(boxed_content(text))


@answer_rule("answer_tags")
def answer_tags(text: str) -> str | None:
    """The last <answer>...</answer> content (reasoning-gym's answer format)."""
    found = ANSWER_TAG.findall(text)
    return _stripped(found[-1]) if found else None


@answer_rule("answer_is")
def answer_is(text: str) -> str | None:
    """What follows the last "the answer is" (or "answer:"), to the end of its sentence, a final period removed."""
    cues = list(ANSWER_IS.finditer(text))
    if not cues:
        return None
    line = text[cues[-1].end() :].split("\n", 1)[0]
    return _stripped(SENTENCE_END.split(line, 1)[0].strip().removesuffix("."))


@answer_rule("stated_in_sentence")
def stated_in_sentence(text: str) -> str | None:
    """The answer the final sentence states, in the first of these forms it has: a bold **X** (the last), a quoted
    word or phrase that ends it ('The opposite of "fast" is "slow."'), or what follows its first "is" / "are" /
    "was" within 80 characters of its end ('The capital of France is Paris.'; a quoted span opening it: 'is "sad" or
    "somber".'), a leading article or possessive dropped ("his aunt": aunt). None when the sentence has none of
    them."""
    sentence = final_sentence(text).strip()
    bold = BOLD.findall(sentence)
    if bold:
        return _stripped(next(group for group in bold[-1] if group))
    quoted = QUOTED_AT_END.search(sentence)
    if quoted:
        return _stripped(quoted.group(1))
    stated = IS_AT_END.search(sentence)
    if stated:
        said = stated.group(1).strip()
        opening = QUOTED_FIRST.match(said)  # 'is "sad" or "somber" in English': the first quoted answer
        return _stripped(opening.group(1) if opening else DETERMINER.sub("", said).strip(" ,;:"))
    return None


@answer_rule("last_line")
def last_line(text: str) -> str | None:
    """The last non-empty line."""
    lines = [line for line in text.splitlines() if line.strip()]
    return _stripped(lines[-1]) if lines else None


@answer_rule("last_number")
def last_number(text: str) -> str | None:
    """The last number written, thousands separators removed."""
    numbers = LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def is_numeric_reference(reference: str) -> bool:
    """A reference that is a number (or a fraction, or a LaTeX expression): mathematics, read by `stated`."""
    return bool(NUMBER_REFERENCE.fullmatch(reference) or LATEX_REFERENCE.fullmatch(reference))


def auto_choice(references: list[str]) -> str:
    """`stated` when most of the references (at least 90% of those given) are numbers, else `phrase`."""
    given = [r for r in references if r.strip()]
    numeric = sum(is_numeric_reference(r) for r in given)
    return "stated" if given and numeric >= 0.9 * len(given) else "phrase"


def normalise_answer(text: str) -> str:
    """Case-folded, \\text{} unwrapped, surrounding whitespace, $, quotes and a final period removed, runs of
    whitespace made one space: ' \\text{Paris}. ' and 'paris' are the same answer."""
    text, previous = " ".join(TEXT_COMMAND.sub(r"\1", text).split()), None
    while text != previous:
        previous, text = text, text.strip(" $\"'`*").removesuffix(".")
    return text.casefold()


def final_sentence(text: str) -> str:
    """The last sentence of the last non-empty line."""
    line = last_line(text) or ""
    sentences = [s for s in SENTENCE_END.split(line) if s.strip()]
    return sentences[-1] if sentences else ""


def lenient_match(completion: str, reference: str) -> bool | None:
    """The reference (normalised) appears anywhere in the completion's final sentence, as whole words: right in
    content whatever the format. Set beside the run's own labels, it tells a gain in format from a gain in content
    (None: an empty reference)."""
    wanted = normalise_answer(str(reference))
    if not wanted:
        return None
    said = normalise_answer(final_sentence(completion))
    return re.search(rf"(?<!\w){re.escape(wanted)}(?!\w)", said) is not None


def vote_key(answer: str | None) -> str | None:
    """What maj@k votes on and distinct answers count: the answer normalised, spaces removed ('New York', 'new york'
    and '"New York".' are one answer; '0.5' and '1/2' stay two)."""
    return None if answer is None else normalise_answer(answer).replace(" ", "") or None


def check_answer(name: str) -> None:
    """The resolve phase: `auto`, a built-in, or an importable f(text) that returns a str or None on a sample."""
    if name == AUTO or name in BUILT_IN:
        return
    user_extractor(name)("The answer is 42.")


def user_extractor(path: str) -> AnswerExtractor:
    """The user's function, each call checked: what it raises or a result that is not a str / None, one UserError."""
    if ":" not in path and "." not in path:
        raise UserError(
            f"{KEY}={path}: not a built-in ({', '.join([AUTO, *BUILT_IN])}) nor an import path; write module:name, "
            f"e.g. {KEY}=my_answers:final_word ({CONVENTION})"
        )
    func = import_callable(path, KEY, "an answer extractor")
    signature = signature_of(func)
    if signature is not None:
        try:
            signature.bind("")
        except TypeError as err:
            raise UserError(f"{KEY}={path}: cannot be called with one text ({err}); {CONVENTION}") from None
    where = f"{KEY}={path}"

    def extract(text: str) -> str | None:
        answer = call_user(func, where, text, given="a completion's text")
        if answer is not None and not isinstance(answer, str):
            shown = f"{answer!r:.40}"
            raise UserError(f"{where} returned a {type(answer).__name__} ({shown}), not a str or None; {CONVENTION}")
        return answer

    return extract


def build_extractor(name: str, references: list[str]) -> tuple[AnswerExtractor, str]:
    """The run's extractor and the rule's name (auto: the rule it chose by the training set's `references`)."""
    if name == AUTO:
        name = auto_choice(references)
    return (BUILT_IN[name] if name in BUILT_IN else user_extractor(name)), name
