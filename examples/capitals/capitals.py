"""A researcher's own components for grpo_exp, in their own project: nothing here edits the package.

- `concise`: a reward factory (configs/reward/concise.yaml passes its settings);
- `is_correct`: the correctness labels of a task that is not mathematics (verifier.labels=capitals:is_correct);
- `capital`: a tool the policy may call in a multi-turn rollout (rollout.tools=[capitals:capital]);
- `rows`: the same problems from a function instead of the file (dataset=function dataset.function=capitals:rows).
"""

import json
import re
from pathlib import Path

DATA = Path(__file__).parent / "data" / "capitals.jsonl"
CAPITALS = {row["country"]: row["capital"] for row in map(json.loads, DATA.read_text().splitlines())}


def make_concise(max_words: int = 12):
    """A reward for answering in at most `max_words` words: 1 up to there, falling linearly to 0 at twice that."""

    def concise(prompts, completions, **kwargs) -> list[float]:
        lengths = [len(completion[-1]["content"].split()) for completion in completions]
        return [min(1.0, max(0.0, 2.0 - n / max_words)) for n in lengths]

    return concise


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z]+", text.lower()))


def is_correct(completion: str, solution: str) -> bool | None:
    """Correct when the capital's name is in the answer's last line (case, accents of punctuation aside)."""
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return False
    return f" {_words(solution)} " in f" {_words(lines[-1])} "


def capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: the country's name in English, e.g. France.
    """
    for name, city in CAPITALS.items():
        if name.lower() == country.strip().lower():
            return city
    raise KeyError(f"no capital known for {country!r}")


def rows(limit: int | None = None) -> list[dict]:
    """The problems as rows with a question and an answer field (configs/experiment/capitals_function.yaml)."""
    problems = [{"question": f"What is the capital of {c}?", "answer": city} for c, city in CAPITALS.items()]
    return problems[:limit]
