"""The judge's rubric: the request put to the judge, and the parsing of its JSON reply (pure functions)."""

import json
import math
import re

CRITERIA = ("accuracy", "grammar", "informativeness", "coherence")
LOWEST, HIGHEST = 1, 5
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


def _in_range(value) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and LOWEST <= value <= HIGHEST
    )
