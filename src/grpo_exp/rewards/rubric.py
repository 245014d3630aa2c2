"""The judge's rubric: the request put to the judge, and reading its reply (pure functions).

Two ways to read a reply: as score tokens (the reply is forced open at a criterion's score, `{"accuracy": `, and
the judge's distribution over the tokens "1".."5" there gives an expected score: it always exists), or as free
text (the judge writes the JSON, which is parsed; it may fail)."""

import json
import math
import re

CRITERIA = ("accuracy", "grammar", "informativeness", "coherence")
LOWEST, HIGHEST = 1, 5
SCORES = tuple(range(LOWEST, HIGHEST + 1))
SCORE_TOKENS = tuple(str(score) for score in SCORES)
# Free-text mode: the reply's JSON schema, for servers with structured output (response_format).
REPLY_SCHEMA = {
    "type": "object",
    "properties": {
        **{c: {"type": "integer", "minimum": LOWEST, "maximum": HIGHEST} for c in CRITERIA},
        "rationale": {"type": "string"},
    },
    "required": list(CRITERIA),
}
# Candidate JSON objects in a reply (judges like to wrap them in prose or ``` fences); no nesting needed.
JSON_OBJECT = re.compile(r"\{[^{}]*\}")


def rubric_messages(system_prompt: str | None, template: str, prompt: str, response: str) -> list[dict[str, str]]:
    # str.replace, not str.format: the template shows a literal JSON example with braces.
    request = template.replace("{prompt}", prompt).replace("{response}", response)
    messages = [{"role": "user", "content": request}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def parse_rubric_reply(reply: str | None) -> float | None:
    """The reward from a judge's reply: mean of the four 1-5 scores divided by 5; None if the reply is unusable
    (no JSON object with all four criteria as numbers within 1-5)."""
    if not reply:
        return None
    for candidate in JSON_OBJECT.findall(reply):
        try:
            scores = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        values = [scores.get(c) for c in CRITERIA] if isinstance(scores, dict) else []
        if len(values) == len(CRITERIA) and all(_in_range(v) for v in values):
            return sum(values) / len(values) / HIGHEST
    return None


def score_position(criterion: str) -> str:
    """The judge's reply opened at one criterion's score: '{"grammar": '. Each criterion is read from its own
    opening of the reply (not after the scores chosen for the others), so that a near-tie between two scores,
    which a small numerical difference between backends can flip, never changes the context of the next."""
    return f'{{"{criterion}": '


def expected_score(probabilities: list[float]) -> float | None:
    """The expected score over 1..5 from (unnormalised) probabilities of the five score tokens, renormalised over
    them; None if all are 0."""
    total = sum(probabilities)
    if not total > 0:
        return None
    return sum(score * p for score, p in zip(SCORES, probabilities, strict=True)) / total


def rubric_reward(expected_scores: list[float]) -> float:
    """Data-Juicer's reward: the mean of the criteria's 1-5 scores divided by 5 (0.2-1.0)."""
    return sum(expected_scores) / len(expected_scores) / HIGHEST


def _in_range(value) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and LOWEST <= value <= HIGHEST
    )
