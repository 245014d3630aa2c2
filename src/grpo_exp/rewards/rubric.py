"""The judge's rubric: the request put to the judge, and reading its reply (pure functions).

A rubric (conf/judge/rubric/<name>.yaml, schema.RubricSchema) is a request template, the criteria the judge scores
(the keys of its JSON reply) and their integer score range; the reward is the criteria's mean score divided by the
highest (Data-Juicer's quality rubric, the default: four 1-5 scores, 0.2-1.0). Two ways to read a reply: as score
tokens (the reply is forced open at a criterion's score, `{"accuracy": `, and the judge's distribution over the
tokens "1".."5" there gives an expected score: it always exists), or as free text (the judge writes the JSON,
which is parsed; it may fail)."""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_exp.errors import UserError
from grpo_exp.schema import JudgeMode, RubricSchema

CRITERIA = ("accuracy", "grammar", "informativeness", "coherence")
LOWEST, HIGHEST = 1, 5
RESERVED_KEYS = ("rationale",)  # the reply's other key


@dataclass(frozen=True)
class Rubric:
    """The criteria and score range of a rubric (the quality rubric's by default)."""

    criteria: tuple[str, ...] = CRITERIA
    lowest: int = LOWEST
    highest: int = HIGHEST

    @property
    def scores(self) -> tuple[int, ...]:
        return tuple(range(self.lowest, self.highest + 1))

    @property
    def score_tokens(self) -> tuple[str, ...]:
        return tuple(str(score) for score in self.scores)

    @property
    def reply_schema(self) -> dict:
        """Free-text mode: the reply's JSON schema, for servers with structured output (response_format)."""
        score = {"type": "integer", "minimum": self.lowest, "maximum": self.highest}
        return {
            "type": "object",
            "properties": {**{c: dict(score) for c in self.criteria}, "rationale": {"type": "string"}},
            "required": list(self.criteria),
        }


QUALITY = Rubric()
SCORES = QUALITY.scores
SCORE_TOKENS = QUALITY.score_tokens
REPLY_SCHEMA = QUALITY.reply_schema
# Candidate JSON objects in a reply (judges like to wrap them in prose or ``` fences); no nesting needed.
JSON_OBJECT = re.compile(r"\{[^{}]*\}")


def rubric_of(judge: DictConfig) -> Rubric:
    """The rubric of a judge config (judge.rubric, checked by check_rubric)."""
    rubric = judge.rubric
    return Rubric(tuple(rubric.criteria), int(rubric.lowest), int(rubric.highest))


def load_rubric_file(judge: DictConfig) -> None:
    """judge.rubric_file: the YAML file's rubric replaces judge.rubric, on RubricSchema (the resolve phase, before the
    run's config is recorded, so that it records the rubric itself)."""
    path = judge.rubric_file
    if path is None:
        return
    where = f"judge.rubric_file={path}"
    if not Path(path).is_file():
        raise UserError(f"{where}: no such file")
    try:
        loaded = OmegaConf.load(path)
        if not isinstance(loaded, DictConfig):
            raise UserError(f"{where}: not a YAML mapping of a rubric (system_prompt, template, criteria, ...)")
        rubric = OmegaConf.merge(OmegaConf.structured(RubricSchema), loaded)
        problem = template_problem(rubric)
        if problem:
            raise UserError(f"{where}: {problem}")
        judge.rubric = rubric
    except UserError:
        raise
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as err:  # bad YAML, an unknown key, a wrong type
        message = str(err).splitlines()[0]
        raise UserError(
            f"{where}: {message} (a rubric's keys: system_prompt, template, criteria, lowest, highest)"
        ) from None


def template_problem(rubric: DictConfig) -> str | None:
    """What is wrong with a rubric's template, if anything."""
    if OmegaConf.is_missing(rubric, "template"):
        return "judge.rubric.template is required: the request to the judge, with {prompt} and {response}"
    missing = [part for part in ("{prompt}", "{response}") if part not in rubric.template]
    if missing:
        return f"judge.rubric.template must contain {' and '.join(missing)} (where the text is filled in)"
    return None


def check_rubric(judge: DictConfig) -> None:
    """The rubric (the resolve phase): a template asking for every criterion, criteria that are distinct identifiers,
    a score range, single-digit scores where they are read as tokens. One UserError naming the key."""
    where = f"judge.rubric_file={judge.rubric_file}: " if judge.get("rubric_file") else ""
    rubric = judge.rubric
    key = "judge.rubric"
    problem = template_problem(rubric)
    if problem:
        raise UserError(f"{where}{problem}")
    criteria = list(rubric.criteria)
    if not criteria:
        raise UserError(
            f"{where}{key}.criteria is empty: list what the judge scores, the keys of its JSON reply, e.g. "
            f"{key}.criteria=[accuracy,clarity]"
        )
    for criterion in criteria:
        if not isinstance(criterion, str) or not criterion.isidentifier() or criterion in RESERVED_KEYS:
            raise UserError(
                f"{where}{key}.criteria={criteria}: {criterion!r} is not a criterion's name: each is an identifier "
                f"(letters, digits, _), not {', '.join(RESERVED_KEYS)}"
            )
        if criterion.lower() not in rubric.template.lower():
            raise UserError(
                f"{where}{key}.criteria={criteria}: {key}.template never names {criterion!r}: the judge replies with "
                "the keys the template asks for"
            )
    repeated = sorted({c for c in criteria if criteria.count(c) > 1})
    if repeated:
        raise UserError(f"{where}{key}.criteria={criteria}: {repeated} named more than once")
    if not rubric.lowest < rubric.highest:
        raise UserError(
            f"{where}{key}.lowest={rubric.lowest}, {key}.highest={rubric.highest}: the lowest score must be below the "
            "highest"
        )
    if rubric.highest <= 0:
        raise UserError(
            f"{where}{key}.highest={rubric.highest}: the reward is the mean score divided by the highest score, "
            "which must be positive"
        )
    if judge.mode is JudgeMode.scores and not (0 <= rubric.lowest and rubric.highest <= 9):
        raise UserError(
            f"{where}{key}.lowest={rubric.lowest}, {key}.highest={rubric.highest}: judge.mode=scores reads each score "
            "as one token, so scores are single digits (0-9); use judge.mode=text for a wider range"
        )


def rubric_messages(system_prompt: str | None, template: str, prompt: str, response: str) -> list[dict[str, str]]:
    # str.replace, not str.format: the template shows a literal JSON example with braces.
    request = template.replace("{prompt}", prompt).replace("{response}", response)
    messages = [{"role": "user", "content": request}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def parse_rubric_reply(reply: str | None, rubric: Rubric = QUALITY) -> float | None:
    """The reward from a judge's reply: mean of the criteria's scores divided by the highest score; None if the reply
    is unusable (no JSON object with every criterion as a number within the score range)."""
    if not reply:
        return None
    for candidate in JSON_OBJECT.findall(reply):
        try:
            scores = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        values = [scores.get(c) for c in rubric.criteria] if isinstance(scores, dict) else []
        if len(values) == len(rubric.criteria) and all(_in_range(v, rubric) for v in values):
            return sum(values) / len(values) / rubric.highest
    return None


def score_position(criterion: str) -> str:
    """The judge's reply opened at one criterion's score: '{"grammar": '. Each criterion is read from its own
    opening of the reply (not after the scores chosen for the others), so that a near-tie between two scores,
    which a small numerical difference between backends can flip, never changes the context of the next."""
    return f'{{"{criterion}": '


def expected_score(probabilities: list[float], rubric: Rubric = QUALITY) -> float | None:
    """The expected score over the rubric's range (1..5) from (unnormalised) probabilities of its score tokens,
    renormalised over them; None if all are 0."""
    total = sum(probabilities)
    if not total > 0:
        return None
    return sum(score * p for score, p in zip(rubric.scores, probabilities, strict=True)) / total


def rubric_reward(expected_scores: list[float], rubric: Rubric = QUALITY) -> float:
    """Data-Juicer's reward: the mean of the criteria's scores divided by the highest (1-5 scores: 0.2-1.0)."""
    return sum(expected_scores) / len(expected_scores) / rubric.highest


def _in_range(value, rubric: Rubric) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and rubric.lowest <= value <= rubric.highest
    )
