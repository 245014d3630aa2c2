"""The judge's score-token protocol and failure semantics: hand-computed values, the cached local scorer against a
plain one, an OpenAI-compatible server (a stub here; vLLM serving the embedded model: tests/test_vllm.py), and what
a judge failure does to TRL's advantages in a real training step."""

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_exp.data import load_splits
from grpo_exp.models import load_tokenizer
from grpo_exp.rewards.judge import RubricJudge, build_judge, chat_prompt
from grpo_exp.rewards.rubric import CRITERIA, expected_score, rubric_messages, rubric_reward, score_position
from grpo_exp.rewards.score_tokens import score_token_ids, score_tokens_locally
from grpo_exp.rollout.flow import group_advantages
from grpo_exp.stats import impute_group_means, score_statistics
from grpo_exp.trainer.config import grpo_exp_config
from grpo_exp.trainer.scored_batch import aggregated_reward
from support.config import TINY_RUN, compose_config
from support.servers import free_port, stub_judge_overrides, stub_server
from tests.helpers.tiny_trainer import PLAIN_TRL, Recording, knob_overrides


def test_the_reply_is_opened_at_each_criterions_score():
    assert [score_position(c) for c in CRITERIA] == [
        '{"accuracy": ',
        '{"grammar": ',
        '{"informativeness": ',
        '{"coherence": ',
    ]


def test_expected_score_renormalises_over_the_five_tokens():
    assert expected_score([0.0, 0.0, 0.5, 0.5, 0.0]) == 3.5
    assert expected_score([0.25, 0.0, 0.0, 0.0, 0.25]) == 3.0
    assert expected_score([0.0, 0.0, 0.0, 0.0, 0.02]) == 5.0  # unnormalised: only the ratios count
    assert expected_score([0.0] * 5) is None
    assert rubric_reward([5, 5, 5, 5]) == 1.0 and rubric_reward([1, 2, 3, 4]) == 0.5


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs, tiny_config):
    tokenizer = load_tokenizer(tiny_config.model, tiny_config.cache_dir)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dirs(seed=0)).eval(), tokenizer


def judge_prompts(tokenizer, pairs) -> list[str]:
    cfg = compose_config(["reward=judge"]).judge
    return [chat_prompt(tokenizer, rubric_messages(cfg.rubric.system_prompt, cfg.rubric.template, *p)) for p in pairs]


PAIRS = [("What is 2 + 3?", "5"), ("Calculate 17 - 9.", "The answer is \\boxed{8}."), ("What is 6 * 7?", "41, I think")]


def test_the_score_tokens_are_single_digit_tokens_where_the_reply_opens(tiny):
    _, tokenizer = tiny
    ids = score_token_ids(tokenizer, judge_prompts(tokenizer, PAIRS[:1])[0] + score_position("accuracy"))
    assert [tokenizer.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]


@torch.no_grad()
def plain_scores(model, tokenizer, prompt: str) -> list[float]:
    """The protocol without batching or cache: each criterion's whole text read on its own."""
    digits = score_token_ids(tokenizer, prompt + score_position("accuracy"))
    expected = []
    for criterion in CRITERIA:
        ids = tokenizer(prompt + score_position(criterion), return_tensors="pt", add_special_tokens=False)
        probabilities = torch.softmax(model(input_ids=ids["input_ids"]).logits[0, -1, digits], dim=-1).tolist()
        expected.append(expected_score(probabilities))
    return expected


# Groups as in a training step: several responses to one question (of different lengths), and a question alone.
GROUPED = [
    *PAIRS,
    ("What is 2 + 3?", "2 + 3 = 5, so the answer is 5."),
    ("What is 2 + 3?", "6"),
    ("Calculate 17 - 9.", "8"),
]


@pytest.mark.parametrize("batch_size", [8, 2])
def test_batched_cached_scores_equal_one_by_one_full_reads(tiny, batch_size):
    model, tokenizer = tiny
    prompts = judge_prompts(tokenizer, GROUPED)  # of different lengths: padding inside the batch
    batched = score_tokens_locally(model, tokenizer, prompts, batch_size, groups=[q for q, _ in GROUPED])
    for prompt, scores in zip(prompts, batched, strict=True):
        assert scores == pytest.approx(plain_scores(model, tokenizer, prompt), abs=1e-5)
        assert len(scores) == 4 and all(1.0 <= s <= 5.0 for s in scores)


def run_judge(judge: RubricJudge, pairs):
    return asyncio.run(judge.score(pairs))


def test_the_local_judge_always_scores_and_caches_across_steps():
    cfg = compose_config(["reward=judge", "judge.model=tiny"])
    judge = build_judge(cfg.judge, cfg.cache_dir)
    rewards, counters = run_judge(judge, [PAIRS[0], PAIRS[1], PAIRS[0]])
    assert rewards[0] == rewards[2] and all(0.2 <= r <= 1.0 for r in rewards)
    assert counters == {
        "judge/failures": 0.0,
        "judge/requests": 2.0,
        "judge/unique_pairs": 2.0,
        "judge/cache_hits": 0.0,
    }
    again, counters = run_judge(judge, [PAIRS[1], PAIRS[2]])  # the next step: one pair seen before
    assert again[0] == rewards[1] and counters["judge/cache_hits"] == 1.0 and counters["judge/requests"] == 1.0


def openai_judge(port: int, *overrides: str) -> RubricJudge:
    cfg = compose_config(
        [
            "reward=judge",
            *stub_judge_overrides(port),
            *overrides,
        ]
    )
    return build_judge(cfg.judge, cfg.cache_dir)


def test_an_endpoint_scores_from_logprobs_and_one_failed_pair_fails_alone():
    port = free_port()
    failing = ("What is 1 + 1?", "FAIL_ME")
    with stub_server("fail_marked", port):
        rewards, counters = run_judge(openai_judge(port), [*PAIRS, failing])
    assert all(0.2 <= r <= 1.0 for r in rewards[:3]) and len(set(rewards[:3])) == 3
    assert rewards[3] is None and counters["judge/failures"] == 1.0


def test_impute_group_means_fills_a_failure_with_its_group_mean_only():
    nan = math.nan
    rewards = torch.tensor(
        [
            [1.0, nan, nan],
            [1.0, 0.6, nan],
            [0.0, 0.8, nan],
            [0.0, 0.7, nan],  # judge failed for member 0
            [nan, nan, nan],
            [1.0, 0.5, nan],
            [1.0, 0.5, nan],
            [0.0, 0.5, nan],  # member 0: nothing scored it
        ]
    )
    filled, imputed = impute_group_means(rewards, group_size=4)
    assert filled[0, 1].item() == pytest.approx(0.7)  # the mean of 0.6, 0.8, 0.7
    assert imputed.sum().item() == 1 and imputed[0, 1]
    assert torch.isnan(filled[4]).all()  # unscorable stays unscorable
    assert torch.isnan(filled[:, 2]).all()  # a component that scored nobody in a group is left alone


def test_a_judge_failure_moves_no_member_against_its_group_mates():
    nan = math.nan
    math_reward = [1.0, 1.0, 0.0, 0.0]
    rewards = torch.tensor([[m, j] for m, j in zip(math_reward, [nan, 0.6, 0.6, 0.6], strict=True)])
    weights = torch.tensor([1.0, 1.0])

    def advantages(r):
        return group_advantages(aggregated_reward(r, weights, "sum_then_normalize", 4).view(1, 4))[0].tolist()

    math_only = group_advantages(torch.tensor([math_reward]))[0].tolist()
    assert advantages(rewards) != pytest.approx(math_only, abs=1e-3)  # TRL's nansum: the failure is a penalty
    assert advantages(impute_group_means(rewards, 4)[0]) == pytest.approx(math_only, abs=1e-4)


def test_score_statistics():
    scores = torch.tensor([[0.9, 0.5], [0.4, math.nan]])
    correct = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    stats = score_statistics(scores, correct, "judge")
    assert stats["judge/mean"] == pytest.approx(0.6)
    assert stats["judge/group_std"] == pytest.approx(0.1)  # groups: std 0.2 and 0 (one member)
    assert stats["judge/auroc"] == 1.0  # 0.9 (correct) above 0.5 and 0.4 (wrong)
    assert math.isnan(score_statistics(scores, torch.ones(2, 2), "judge")["judge/auroc"])


def judge_like(completions, **kwargs):
    """A judge whose request failed for exactly one member (the first of the batch), constant elsewhere."""
    return [None if i == 0 else 0.6 for i in range(len(completions))]


def length_reward(completions, **kwargs):
    return [len(c[-1]["content"]) / 100 for c in completions]


def test_in_a_real_step_the_failed_member_gets_the_advantage_of_its_other_rewards(tmp_path, tiny_model_dir):
    one_step = ["trainer.num_generations=4", "trainer.max_steps=1", "logger=none", *knob_overrides(PLAIN_TRL)]
    cfg = compose_config([*TINY_RUN, *one_step])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=[length_reward, judge_like],
        args=grpo_exp_config(cfg.trainer, tmp_path / "trainer", "none", [1.0, 1.0], False),
        train_dataset=load_splits(cfg.dataset)[0],
        processing_class=tokenizer,
    )
    trainer.train()
    (batch,) = trainer.batches
    assert batch.imputed[:, 1].tolist() == [True] + [False] * 7 and batch.rewards[0, 1].item() == pytest.approx(0.6)
    # The judge is constant where it answered, so it adds no advantage to anyone, the failed member included.
    expected = group_advantages(batch.grouped(batch.rewards[:, 0]))
    assert batch.grouped(batch.advantages).flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-4)
    assert trainer.state.log_history[0]["rewards/judge_like/imputed"] == 1.0


def test_the_cache_keeps_the_most_recently_used_pairs():
    cfg = compose_config(["reward=judge", "judge.model=tiny", "judge.cache_size=2"])
    judge = build_judge(cfg.judge, cfg.cache_dir)
    run_judge(judge, [PAIRS[0], PAIRS[1]])
    run_judge(judge, [PAIRS[0]])  # a hit: PAIRS[0] is now the most recently used
    run_judge(judge, [PAIRS[2]])  # full: the least recently used, PAIRS[1], goes
    assert list(judge.cache) == [PAIRS[0], PAIRS[2]]
