"""Reward components on hand-written cases: correct, wrong, unparseable, adversarial."""

import math

import pytest
from omegaconf import OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.rewards.custom import checked_rewards
from grpo_exp.rewards.format import make_format_reward
from grpo_exp.rewards.length import make_length_reward
from grpo_exp.rewards.math import make_math_reward
from grpo_exp.rewards.registry import build_rewards, reward_weights, typed_components
from grpo_exp.schema import FormatStyle
from grpo_exp.text import boxed_content, completion_text, last_boxed_span
from grpo_exp.verification.labels import built_in_labels
from support.reward_cases import ADVERSARIAL


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    "text,reference,expected",
    [
        ("So the answer is \\boxed{14}.", "14", 1.0),
        ("5 - 3 = 2", "2", 1.0),  # a plain final number counts
        ("#### 72", "72", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("First 12, then \\boxed{13}", "12", 0.0),  # the boxed answer wins over earlier numbers
        ("I don't know", "3", 0.0),
        ("", "3", 0.0),
        ("The total is 1,000 apples.", "1000", 1.0),
        ("\\boxed{3/4}", "0.75", 1.0),  # a fraction is a value
        # Restating the question is not answering it (what the embedded model learned to exploit when
        # math-verify's anchored extraction took "the final answer ... the expression 5 - 33." as the answer):
        (
            "To find the final answer, we need to evaluate the expression 5 - 33.\n\nFirst, 5 and 33 give 12.",
            "-28",
            0.0,
        ),
        ("the expression 4 - 1 is simply 4.\n\nHowever, in", "3", 0.0),
        ("\\boxed{5 - 33}", "-28", 0.0),
        ("\\boxed{7 \\times 6}", "42", 0.0),
        ("5 - 33 = -28", "-28", 1.0),
        ("$$5 + 3 = \\frac{16}{2}$$", "8", 1.0),  # an unboxed LaTeX answer: the right-hand side
        ("So we need $5 - 33$", "-28", 0.0),
        ("\\boxed{1 + \\sqrt{2}}", "$1+\\sqrt{2}$", 1.0),  # a closed form is still a value
    ],
)
def test_math_reward(text, reference, expected):
    assert make_math_reward(built_in_labels())([chat(text)], [reference]) == [expected]


def test_math_reward_skips_unparseable_reference():
    assert make_math_reward(built_in_labels())([chat("\\boxed{1}")], ["no number here"]) == [None]


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_math_reward_on_pathological_completions_finishes_and_scores_zero(name):
    # Bounded by math-verify's timeouts (2 s per parse/compare) and the 4,000-character tail.
    assert make_math_reward(built_in_labels())([chat(ADVERSARIAL[name])], ["1"]) == [0.0]


@pytest.mark.parametrize(
    "text,strict,expected",
    [
        ("Work. \\boxed{7}.", True, 1.0),
        ("Work. \\boxed{7}", False, 1.0),
        ("\\boxed{7} and then more words", True, 0.0),
        ("\\boxed{7} and then more words", False, 0.5),
        ("\\boxed{1} \\boxed{2}", False, 0.5),
        ("\\boxed{}", False, 0.0),
        ("no answer", False, 0.0),
        ("\\boxed{\\frac{1}{2}}", True, 1.0),
    ],
)
def test_format_boxed(text, strict, expected):
    assert make_format_reward(FormatStyle.boxed, strict)([chat(text)]) == [expected]


@pytest.mark.parametrize(
    "text,strict,expected",
    [
        ("<think>hmm</think><answer>7</answer>", True, 1.0),
        ("<think>hmm</think>\n<answer>7</answer>\n", True, 1.0),
        ("<think>hmm</think>7", True, 0.0),
        ("<think>hmm</think>7", False, 0.5),
        ("<answer>7</answer>", False, 0.5),
        ("plain", False, 0.0),
    ],
)
def test_format_think_answer(text, strict, expected):
    assert make_format_reward(FormatStyle.think_answer, strict)([chat(text)]) == [expected]


@pytest.mark.parametrize(
    "text,strict,expected",
    [
        ("a\n#### 72", True, 1.0),
        ("#### 72\nmore", True, 0.0),
        ("#### 72\nmore", False, 0.5),
        ("72", False, 0.0),
    ],
)
def test_format_hash(text, strict, expected):
    assert make_format_reward(FormatStyle.hash, strict)([chat(text)]) == [expected]


def test_length_reward_is_linear_and_clipped():
    reward = make_length_reward(target_chars=100)
    assert reward([chat(""), chat("x" * 50), chat("x" * 500)]) == [1.0, 0.5, 0.0]


def test_dapo_overlong_penalty_by_hand():
    """max_completion_length 64, cache 16: free up to 48 tokens, then (48 - len) / 16, -1 at 64 and beyond."""
    from grpo_exp.rewards.overlong import cache_size, make_overlong_reward, overlong_penalty

    assert [overlong_penalty(n, 64, 16) for n in (0, 48, 49, 56, 64, 65)] == [0.0, 0.0, -1 / 16, -0.5, -1.0, -1.0]
    reward = make_overlong_reward(cache_tokens=16, max_completion_length=64)
    assert reward.__name__ == "overlong"
    assert reward([chat("a"), chat("b")], completion_ids=[[7] * 40, [7] * 60]) == [0.0, -0.75]
    assert cache_size(None, 64) == 12 and cache_size(None, 3) == 1  # the paper's fifth, at least one token
    with pytest.raises(UserError, match=r"cache_tokens=100 is longer than trainer.max_completion_length=64"):
        cache_size(100, 64)


def test_kimi_length_reward_by_hand():
    """Per prompt: lambda = 0.5 - (len - min) / (max - min); correct gets lambda, wrong min(0, lambda); a group of
    equal lengths gets 0; a completion the labels cannot judge counts as wrong."""
    from grpo_exp.rewards.length_by_correctness import length_rewards, make_length_by_correctness_reward

    lengths = [10, 20, 30, 10, 30, 5, 5, 12]
    correct = [True, True, False, False, True, True, False, None]
    groups = ["a", "a", "a", "b", "b", "c", "c", "a"]
    # a: min 10, max 30 -> lambda 0.5, 0.0, -0.5 and (12) 0.4; b: 0.5 (wrong: 0), -0.5; c: equal lengths
    assert length_rewards(lengths, correct, groups) == pytest.approx([0.5, 0.0, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0])
    reward = make_length_by_correctness_reward(built_in_labels())
    prompts = [[{"role": "user", "content": "1 + 1?"}]] * 2 + [[{"role": "user", "content": "2 + 2?"}]] * 2
    completions = [chat("\\boxed{2}"), chat("It is \\boxed{2}"), chat("\\boxed{5}"), chat("\\boxed{4}")]
    scores = reward(completions, ["2", "2", "4", "4"], prompts, completion_ids=[[1] * 3, [1] * 7, [1] * 2, [1] * 9])
    assert scores == pytest.approx([0.5, -0.5, 0.0, -0.5])  # group 2: the short wrong answer gains nothing


def test_repetition_reward_uses_token_ngrams():
    from grpo_exp.rewards.repetition import make_repetition_reward

    reward = make_repetition_reward(ngram_size=2, max_penalty=-1.0)
    assert reward(completion_ids=[[1, 2, 3, 4], [5, 5, 5, 5], [1]]) == [0.0, -1.0 * (1 - 1 / 3), 0.0]


def test_boxed_span_handles_nesting_and_unbalanced_input_in_linear_time():
    assert boxed_content("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert boxed_content("\\boxed{1} then \\boxed{2") == "1"
    assert last_boxed_span("\\boxed{" * 50_000) is None  # would be quadratic without the scan limit
    assert completion_text("plain") == "plain"


def test_build_rewards_keeps_the_order_names_and_weights():
    cfg = OmegaConf.create({"components": {"format": {"weight": 0.2, "style": "hash"}, "math": {"weight": 1.0}}})
    components = typed_components(cfg)
    functions, weights = build_rewards(components, {"verifier": built_in_labels()}), reward_weights(components)
    assert [f.__name__ for f in functions] == ["format", "math"]
    assert weights == [0.2, 1.0]


@pytest.mark.parametrize(
    "components,message",
    [
        ({"nope": {"weight": 1.0}}, "known components"),
        ({"format": {"weight": 1.0, "style": "xml"}}, "reward.components.format"),
        ({"format": {"weight": 1.0, "colour": "red"}}, "its settings are"),
        ({"math": {}}, "reward.components.math.weight"),
    ],
)
def test_build_rewards_rejects_bad_components(components, message):
    with pytest.raises(UserError) as err:
        typed_components(OmegaConf.create({"components": components}))
    assert message in str(err.value)


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_a_users_reward_that_is_not_finite_stops_the_run_naming_the_component(bad):
    with pytest.raises(
        UserError, match=r"reward component 'mine' .* returned -?inf for completion 1: rewards are finite"
    ):
        checked_rewards("mine", "my_rewards:f", [0.5, bad], 2)
