"""The answer extractors (verifier.answer): each built-in rule, `auto`'s choice, the user's own function checked, and
exact_match / maj@k / distinct answers reading a word answer through the run's extractor."""

import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from grpo_exp.answers import (
    BUILT_IN,
    auto_choice,
    build_extractor,
    check_answer,
    lenient_match,
    normalise_answer,
    vote_key,
)
from grpo_exp.errors import UserError
from grpo_exp.schema import VerifierSchema
from grpo_exp.stats import group_statistics
from grpo_exp.verification.labels import build_labels
from tests.helpers.modules import unseen_module_name


@pytest.mark.parametrize(
    ("rule", "text", "expected"),
    [
        ("stated", "so 3 + 4 = 7", "7"),
        ("stated", "\\boxed{Paris} and 3", "Paris"),
        ("stated", "The answer is island.", None),  # mathematics: a word is no answer
        ("phrase", 'The answer is "island".', '"island"'),
        ("phrase", "island", "island"),
        ("phrase", "I think\n\\boxed{New York}\nbecause", "New York"),
        ("phrase", "<think>hm</think><answer> b </answer>", "b"),
        ("phrase", "Final answer: New York\n", "New York"),
        ("phrase", "The answer is island. It comes first.", "island"),
        ("answer_is", "The answer is 3.5 dollars", "3.5 dollars"),
        ("phrase", "first line\n\nlast line  \n", "last line"),
        # a short answer stated in the final sentence (stated_in_sentence)
        ("phrase", 'The opposite of "fast" is "slow."', "slow"),
        ("phrase", 'The opposite of "happy" is "sad" or "somber" in English.', "sad"),
        ("phrase", "The capital of France is Paris.", "Paris"),
        ("phrase", "So the word that comes first is **apple**, as a < b.", "apple"),
        ("phrase", "Bob is Alice's husband.", "husband"),
        ("phrase", "It's 'slow'.", "slow"),
        ("phrase", "I hope this helps!", "I hope this helps!"),  # no stated answer: the last line
        ("phrase", "The conclusion is not valid.", "The conclusion is not valid."),  # "is not" states no answer
        ("stated_in_sentence", "Paris is nice. I like the word **Paris**", "Paris"),
        ("stated_in_sentence", "No answer here", None),
        ("phrase", "   ", None),
        ("boxed", "no box here", None),
        ("answer_tags", "<answer>x</answer> then <ANSWER>y</ANSWER>", "y"),
        ("answer_is", "the answer is 5. The answer is six.", "six"),
        ("last_line", "a\nb\n", "b"),
        ("last_number", "it costs 1,234 then 5.5 dollars", "5.5"),
    ],
)
def test_each_built_in_rule_reads_the_final_answer(rule, text, expected):
    assert BUILT_IN[rule](text) == expected


@pytest.mark.parametrize(
    ("references", "rule"),
    [
        (["12", "-3", "1/2", "2,000", "\\frac{1}{2}", "$4$"], "stated"),
        (["island", "apple", "cat"], "phrase"),
        (["New York", "42"], "phrase"),  # mostly words
        ([], "phrase"),  # nothing to go by: the rule that also reads a boxed number
    ],
)
def test_auto_chooses_by_the_training_references(references, rule):
    assert auto_choice(references) == rule
    assert build_extractor("auto", references)[1] == rule


def test_votes_and_distinct_answers_count_normalised_answers():
    assert vote_key('"New York".') == vote_key("new york") == "newyork"
    assert vote_key("0.5") != vote_key("1/2")  # written apart: voted apart, whatever the labels say
    assert vote_key(None) is None and vote_key(" '' ") is None
    assert normalise_answer(" $\\textbf{Blue}$. ") == "blue"


def verifier_cfg(**values):
    return OmegaConf.merge(OmegaConf.structured(VerifierSchema), values)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("island", True),  # a bare word
        ('The answer is "Island".', True),  # quoted, capitalised, a final period
        ("Let me compare.\n\\boxed{island}", True),
        ("The answer is the island of Crete", False),  # a phrase that is not the reference
        ("apple", False),
    ],
)
def test_exact_match_reads_words_through_the_auto_extractor(completion, expected):
    labels = build_labels(verifier_cfg(labels="exact_match"), ["island", "apple"])
    assert labels.answer_rule == "phrase"
    assert labels([completion], ["island"]) == [expected]


def test_the_arithmetic_default_is_unchanged():
    labels = build_labels(verifier_cfg(), ["7", "12"])
    assert labels.answer_rule == "stated"
    assert labels(["so 3 + 4 = 7", "\\boxed{5 - 33}", "seven"], ["7", "-28", "7"]) == [True, False, False]


def test_maj_at_k_and_distinct_answers_follow_word_labels():
    labels = build_labels(verifier_cfg(labels="exact_match"), ["island"])
    texts = [["island", "The answer is Island.", "apple"], ["cat", "dog", "\\boxed{Cat}"]]
    correct = torch.tensor([labels(group, [ref] * 3) for group, ref in zip(texts, ["island", "cat"], strict=True)])
    stats = group_statistics(
        torch.zeros(2, 3, 1),
        ["correct"],
        correct.float(),
        torch.zeros(2, 3),
        correct.float(),
        texts,
        torch.ones(2, 3),
        labels.answer,
    )
    assert stats["groups/maj@k"] == 1.0  # island twice; cat twice (cat, Cat)
    assert stats["diversity/distinct_answers"] == pytest.approx((2 / 3 + 2 / 3) / 2)


def write_module(tmp_path, monkeypatch, source: str) -> str:
    """The user's module, under a name of its own (a module imported by an earlier test stays imported)."""
    name = unseen_module_name("my_answers")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_the_users_extractor_is_used_by_the_labels(tmp_path, monkeypatch):
    module = write_module(
        tmp_path, monkeypatch, "def first_word(text):\n    return text.split()[0] if text.split() else None\n"
    )
    check_answer(f"{module}:first_word")
    labels = build_labels(verifier_cfg(labels="exact_match", answer=f"{module}:first_word"), ["x"])
    assert labels.answer_rule == f"{module}:first_word"
    assert labels(["Island is my answer", "", "apple island"], ["island"] * 3) == [True, False, False]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(text):\n    return 42\n", "returned a int (42), not a str or None"),
        ("def f(text):\n    raise KeyError('oops')\n", "raised KeyError: 'oops'"),
        ("def f(text, other):\n    return text\n", "cannot be called with one text"),
        ("f = 3\n", "not callable"),
    ],
)
def test_a_bad_user_extractor_is_refused_at_resolve_naming_the_key(tmp_path, monkeypatch, source, message):
    module = write_module(tmp_path, monkeypatch, source)
    with pytest.raises(UserError) as err:
        check_answer(f"{module}:f")
    assert f"verifier.answer={module}:f" in str(err.value) and message in str(err.value)


def test_an_unknown_name_lists_the_built_ins():
    with pytest.raises(UserError) as err:
        check_answer("boxes")
    assert "verifier.answer=boxes" in str(err.value) and "answer_tags" in str(err.value)


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ('The word "tiger" is the first word in alphabetical order.', "tiger", True),  # right, not in the format
        ("tiger", "tiger", True),
        ("First I compare the letters.\nSo it is lemon.", "tiger", False),
        ("I compared tiger and lemon. The first is lemon.", "tiger", False),  # only the final sentence counts
        ("so 3 + 4 = 7", "7", True),
        ("so 3 + 4 = 17", "7", False),  # whole words: 7 is not in 17
        ("anything", " ", None),
    ],
)
def test_lenient_match_finds_the_reference_in_the_final_sentence(completion, reference, expected):
    assert lenient_match(completion, reference) is expected


def test_the_gain_is_split_into_format_and_content():
    from grpo_exp.run.evaluation import format_and_content

    summary = {
        "heldout_accuracy_before": 0.1,
        "heldout_accuracy_after": 0.5,
        "heldout_lenient_accuracy_before": 0.6,
        "heldout_lenient_accuracy_after": 0.6,
    }
    split = format_and_content(summary)
    assert split["heldout_gain_format"] == pytest.approx(0.4) and split["heldout_gain_content"] == pytest.approx(0.0)
    assert format_and_content(summary | {"heldout_accuracy_before": None}) == {}


def test_the_word_rule_reads_the_embedded_models_own_sentences():
    """The embedded model's greedy answers to word tasks (experiments/answer_rules.json, `python -m
    benchmarks.answer_rules`): `phrase` reads what the content check finds in every opposites and capitals answer
    (capitals was not looked at while the rule was written), and never reads worse than the rule before it."""
    import json

    from benchmarks.answer_rules import RULES, read_right, score
    from grpo_exp.paths import REPO_ROOT

    answers = json.loads((REPO_ROOT / "experiments" / "answer_rules.json").read_text())
    rows = {row["task"]: row for row in score(answers)}
    assert rows["capitals"]["phrase"] == rows["capitals"]["content check"] > 0.8
    assert rows["opposites"]["phrase"] == rows["opposites"]["content check"] > 0.5
    for samples in answers.values():
        for sample in samples:
            assert read_right(RULES["phrase"], sample) or not read_right(RULES["phrase (before)"], sample)
