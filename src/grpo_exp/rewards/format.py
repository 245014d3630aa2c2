"""Answer format: does the completion give its final answer the way the prompt asked?"""

import re
from dataclasses import dataclass

from omegaconf import MISSING

from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import FormatStyle
from grpo_exp.text import completion_text, last_boxed_span

STYLES = ("boxed", "think_answer", "hash")
# After the answer, allow closing punctuation / math delimiters only.
TRAILER = re.compile(r"[\s.!$\\\])]*")
THINK_ANSWER = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?\S.*?</answer>\s*", re.DOTALL)
HASH_LINE = re.compile(r"^####\s*\S+\s*$", re.MULTILINE)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def boxed_score(text: str, strict: bool) -> float:
    """1: one \\boxed{answer} that ends the completion; partial 0.5: a \\boxed{answer} elsewhere."""
    span = last_boxed_span(text)
    if span is None or not text[span[0] + len("\\boxed{") : span[1] - 1].strip():
        return 0.0
    if text.count("\\boxed{") == 1 and TRAILER.fullmatch(text[span[1] :]):
        return 1.0
    return 0.0 if strict else 0.5


def think_answer_score(text: str, strict: bool) -> float:
    """1: exactly <think>...</think><answer>...</answer>; partial: 0.25 per tag present exactly once."""
    if THINK_ANSWER.fullmatch(text) and all(text.count(tag) == 1 for tag in TAGS):
        return 1.0
    return 0.0 if strict else 0.25 * sum(text.count(tag) == 1 for tag in TAGS)


def hash_score(text: str, strict: bool) -> float:
    """1: the last line is '#### <answer>' (GSM8K style); partial 0.5: such a line elsewhere."""
    lines = text.rstrip().splitlines()
    if lines and HASH_LINE.fullmatch(lines[-1]):
        return 1.0
    return 0.0 if strict or not HASH_LINE.search(text) else 0.5


SCORERS = {FormatStyle.boxed: boxed_score, FormatStyle.think_answer: think_answer_score, FormatStyle.hash: hash_score}


@dataclass
class FormatReward:
    weight: float = MISSING
    style: FormatStyle = FormatStyle.boxed
    strict: bool = False  # true gives 1/0; false gives 0.5 for an answer present but not cleanly at the end


@reward_component("format", FormatReward)
def make_format_reward(style: FormatStyle, strict: bool):
    scorer = SCORERS[style]

    def format(completions, **kwargs) -> list[float]:  # noqa: A001 - TRL logs the reward under this name
        return [scorer(completion_text(c), strict) for c in completions]

    return format
