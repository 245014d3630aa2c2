"""The judge's rubric from YAML: the user's own (judge/rubric/<name>.yaml in their config directory, or
judge.rubric_file=<path>) with its template, criteria and score range, read in both judge modes; the shipped quality
rubric unchanged; every mistake in a rubric one message naming the key, before any model loads."""

import asyncio
import textwrap
from pathlib import Path

import pytest
import torch

from grpo_exp.errors import UserError
from grpo_exp.models import load_tokenizer
from grpo_exp.rewards.judge import _response_format, build_judge, chat_prompt
from grpo_exp.rewards.rubric import (
    CRITERIA,
    QUALITY,
    REPLY_SCHEMA,
    Rubric,
    expected_score,
    parse_rubric_reply,
    rubric_messages,
    rubric_of,
    rubric_reward,
    score_position,
)
from grpo_exp.rewards.score_tokens import score_token_ids
from grpo_exp.run.resolve import resolve
from grpo_exp.schema import StructuredOutput
from support.config import TINY_RUN, compose_config

MINE = """
system_prompt: You grade answers. You reply with JSON only.
template: |-
  Rate the response on correctness and clarity, each an integer from 1 (poor) to 3 (good).

  Question:
  {prompt}

  Response:
  {response}

  Reply with JSON only: {"correctness": N, "clarity": N}
criteria: [correctness, clarity]
lowest: 1
highest: 3
"""
TWO = Rubric(("correctness", "clarity"), 1, 3)


def test_the_quality_rubric_is_read_from_its_yaml_as_it_was_hard_coded():
    judge = compose_config(["reward=judge"]).judge
    assert rubric_of(judge) == QUALITY == Rubric(CRITERIA, 1, 5)
    assert QUALITY.score_tokens == ("1", "2", "3", "4", "5")
    assert REPLY_SCHEMA == {
        "type": "object",
        "properties": {
            **{c: {"type": "integer", "minimum": 1, "maximum": 5} for c in CRITERIA},
            "rationale": {"type": "string"},
        },
        "required": list(CRITERIA),
    }


def test_a_custom_rubric_reads_its_own_criteria_and_range():
    assert parse_rubric_reply('{"correctness": 3, "clarity": 2, "rationale": "ok"}', TWO) == pytest.approx(5 / 6)
    assert parse_rubric_reply('{"correctness": 3, "clarity": 4}', TWO) is None  # out of its range
    assert parse_rubric_reply('{"correctness": 3}', TWO) is None  # a criterion missing
    # The quality rubric's reply is not this rubric's, and the other way round.
    assert parse_rubric_reply('{"accuracy": 5, "grammar": 5, "informativeness": 5, "coherence": 5}', TWO) is None
    assert parse_rubric_reply('{"correctness": 3, "clarity": 2}') is None
    assert expected_score([0.0, 1.0, 1.0], TWO) == 2.5
    assert rubric_reward([3, 2], TWO) == pytest.approx(5 / 6)
    schema = _response_format(StructuredOutput.json_schema, TWO)["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["correctness", "clarity"]
    assert schema["properties"]["clarity"] == {"type": "integer", "minimum": 1, "maximum": 3}


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    """A user's config directory with their rubric, judge/rubric/mine.yaml (and the same as a loose file)."""
    rubric = tmp_path / "configs" / "judge" / "rubric" / "mine.yaml"
    rubric.parent.mkdir(parents=True)
    rubric.write_text(textwrap.dedent(MINE))
    (tmp_path / "mine.yaml").write_text(textwrap.dedent(MINE))
    return tmp_path / "configs"


def judge_config(*overrides: str):
    cfg = compose_config([*TINY_RUN, "logger=none", "reward=math+judge", "judge.model=tiny", *overrides])
    return resolve(cfg, processes=1).cfg


@pytest.mark.parametrize("how", ["config_dir", "rubric_file"])
def test_the_local_judge_scores_the_users_two_criteria_from_score_tokens(configs, how):
    """`judge/rubric=mine` from the user's config directory, or judge.rubric_file=mine.yaml: the tiny judge reads
    each pair's two criteria at their own openings of the reply, over the score tokens 1..3."""
    choose = (
        [f"hydra.searchpath=[file://{configs}]", "judge/rubric=mine"]
        if how == "config_dir"
        else [f"judge.rubric_file={configs.parent / 'mine.yaml'}"]
    )
    cfg = judge_config(*choose)
    assert list(cfg.judge.rubric.criteria) == ["correctness", "clarity"] and cfg.judge.rubric.highest == 3
    judge = build_judge(cfg.judge, cfg.cache_dir)
    assert judge.rubric == TWO
    pairs = [("What is 2 + 3?", "5"), ("What is 2 + 3?", "six"), ("Calculate 17 - 9.", "The answer is \\boxed{8}.")]
    rewards, counters = asyncio.run(judge.score(pairs))
    assert counters["judge/failures"] == 0 and counters["judge/requests"] == 3
    conversations = [rubric_messages(cfg.judge.rubric.system_prompt, cfg.judge.rubric.template, *p) for p in pairs]
    scores = asyncio.run(judge.backend.score_tokens(conversations, [q for q, _ in pairs]))
    assert all(len(s) == 2 and all(1.0 <= x <= 3.0 for x in s) for s in scores)
    assert rewards == pytest.approx([sum(s) / 2 / 3 for s in scores], abs=1e-6)
    # The same scores as reading each criterion's whole text on its own, over the three score tokens.
    model, tokenizer = judge.backend._model, judge.backend.tokenizer
    for conversation, expected in zip(conversations, scores, strict=True):
        prompt = chat_prompt(tokenizer, conversation)
        digits = score_token_ids(tokenizer, prompt + score_position("correctness"), TWO)
        assert [tokenizer.decode([i]) for i in digits] == ["1", "2", "3"]
        plain = []
        for criterion in TWO.criteria:
            ids = tokenizer(prompt + score_position(criterion), return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                logits = model(input_ids=ids["input_ids"]).logits[0, -1, digits]
            plain.append(expected_score(torch.softmax(logits, dim=-1).tolist(), TWO))
        assert expected == pytest.approx(plain, abs=1e-5)


def test_the_rubric_file_is_recorded_in_the_runs_config(configs):
    spec = resolve(
        compose_config(
            [*TINY_RUN, "reward=math+judge", "judge.model=tiny", f"judge.rubric_file={configs.parent}/mine.yaml"]
        ),
        processes=1,
    )
    assert spec.saved_config["judge"]["rubric"]["criteria"] == ["correctness", "clarity"]
    assert "Rate the response on correctness and clarity" in spec.saved_config["judge"]["rubric"]["template"]


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


BAD_RUBRICS = {
    "no criteria": (
        "template: 'Q: {prompt} A: {response}'",
        "judge.rubric.criteria is empty: list what the judge scores",
    ),
    "not an identifier": (
        "template: 'Rate clear-ness. Q: {prompt} A: {response}'\ncriteria: [clear-ness]",
        "judge.rubric.criteria=['clear-ness']: 'clear-ness' is not a criterion's name",
    ),
    "repeated": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriteria: [clarity, clarity]",
        "judge.rubric.criteria=['clarity', 'clarity']: ['clarity'] named more than once",
    ),
    "not in the template": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriteria: [clarity, depth]",
        "judge.rubric.template never names 'depth'",
    ),
    "no response": (
        "template: 'Rate clarity. Q: {prompt}'\ncriteria: [clarity]",
        "judge.rubric.template must contain {response}",
    ),
    "empty range": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriteria: [clarity]\nlowest: 3\nhighest: 3",
        "judge.rubric.lowest=3, judge.rubric.highest=3: the lowest score must be below the highest",
    ),
    "two-digit scores": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriteria: [clarity]\nhighest: 10",
        "judge.mode=scores reads each score as one token, so scores are single digits (0-9)",
    ),
    "unknown key": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriterias: [clarity]",
        "Key 'criterias' not in 'RubricSchema'",
    ),
    "wrong type": (
        "template: 'Rate clarity. Q: {prompt} A: {response}'\ncriteria: [clarity]\nhighest: five",
        "Value 'five' of type 'str' could not be converted to Integer",
    ),
}


@pytest.mark.parametrize("case", BAD_RUBRICS)
def test_a_bad_rubric_file_is_one_message_naming_the_file_and_key(tmp_path, case):
    text, message = BAD_RUBRICS[case]
    path = write(tmp_path / "rubric.yaml", text)
    with pytest.raises(UserError) as err:
        judge_config(f"judge.rubric_file={path}")
    assert str(err.value).startswith(f"judge.rubric_file={path}: ") and message in str(err.value), str(err.value)


def test_a_bad_rubric_in_the_config_dir_or_on_the_command_line_names_the_key(configs, tmp_path):
    (configs / "judge" / "rubric" / "bad.yaml").write_text(
        "template: 'Rate it: {prompt} {response}'\ncriteria: [tone]\n"
    )
    with pytest.raises(UserError, match=r"^judge.rubric.criteria=\['tone'\]: judge.rubric.template never names 'tone'"):
        judge_config(f"hydra.searchpath=[file://{configs}]", "judge/rubric=bad")
    with pytest.raises(UserError, match=r"^judge.rubric.criteria=\['accuracy', '2x'\]: '2x' is not a criterion's name"):
        judge_config("judge.rubric.criteria=[accuracy,2x]")
    with pytest.raises(UserError, match=r"^judge.rubric_file=.*nope.yaml: no such file"):
        judge_config(f"judge.rubric_file={tmp_path / 'nope.yaml'}")
    # Text mode reads any integer range; a rubric's mistakes matter only where the judge is used.
    judge_config("judge.mode=text", "judge.rubric.highest=10")
    resolve(compose_config([*TINY_RUN, "judge.rubric.criteria=[]"]), processes=1)


def test_the_tiny_tokenizer_writes_every_digit_as_one_score_token(cfg_train):
    tokenizer = load_tokenizer(cfg_train.model, cfg_train.cache_dir)
    digits = score_token_ids(tokenizer, 'Rate it.\n{"depth": ', Rubric(("depth",), 0, 9))
    assert [tokenizer.decode([i]) for i in digits] == [str(d) for d in range(10)]
