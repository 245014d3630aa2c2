"""The LLM judge: the score-token protocol (local, and against a stub server on 127.0.0.1 that fails on purpose;
vLLM serving the embedded model: tests/test_vllm.py), the free-text mode (rubric parsing, retry, then None), the cache,
and what a failure does to the advantages."""

import asyncio
import copy
import json
import os

import pytest
from omegaconf import OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.rewards.judge import build_judge, chat_prompt, judge_failure_budget, make_judge_reward
from grpo_exp.rewards.rubric import parse_rubric_reply, rubric_messages
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from grpo_exp.text import prompt_text
from support.config import TINY_RUN, compose_config
from support.servers import free_port, stub_judge_overrides, stub_server
from tests.helpers.cli import run_cli


@pytest.mark.parametrize(
    "reply,expected",
    [
        ('{"accuracy": 5, "grammar": 5, "informativeness": 5, "coherence": 5, "rationale": "ok"}', 1.0),
        ('```json\n{"accuracy": 1, "grammar": 2, "informativeness": 3, "coherence": 4}\n```', 0.5),
        ('Sure! {"note": 1} then {"accuracy": 4, "grammar": 4, "informativeness": 4, "coherence": 4.0}', 0.8),
        ('{"accuracy": 6, "grammar": 5, "informativeness": 5, "coherence": 5}', None),  # out of range
        ('{"accuracy": 0, "grammar": 5, "informativeness": 5, "coherence": 5}', None),
        ('{"accuracy": true, "grammar": 5, "informativeness": 5, "coherence": 5}', None),
        ('{"accuracy": "5", "grammar": 5, "informativeness": 5, "coherence": 5}', None),
        ('{"accuracy": 5, "grammar": 5, "informativeness": 5}', None),  # a criterion missing
        ("{accuracy: 5, grammar: 5}", None),  # not JSON
        ("It is good.", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_rubric_reply(reply, expected):
    assert parse_rubric_reply(reply) == expected


def test_rubric_messages_fill_the_template_without_touching_json_braces():
    messages = rubric_messages("Be strict.", 'Q: {prompt}\nA: {response}\n{"accuracy": 1}', "2+2?", "4")
    assert messages == [
        {"role": "system", "content": "Be strict."},
        {"role": "user", "content": 'Q: 2+2?\nA: 4\n{"accuracy": 1}'},
    ]
    assert prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "q"


def judge_settings(*overrides: str) -> dict:
    cfg = compose_config(["reward=judge", *overrides])
    return OmegaConf.to_container(cfg.judge, resolve=True, enum_to_str=True)


def judge_reward(*overrides: str, failure_budget: bool = False):
    """The judge reward as a run builds it; without its failure budget unless asked (these tests count failures)."""
    budget = [] if failure_budget else ["judge.max_failure_rate=1.0"]
    cfg = compose_config(["reward=judge", *budget, *overrides])
    return make_judge_reward(build_judge(cfg.judge, cfg.cache_dir))


def score(reward, prompts: list[str], responses: list[str]) -> tuple[list, dict]:
    """Call the reward as TRL does (chat prompts and completions, a log_metric callback)."""
    metrics: dict[str, float] = {}
    chat_prompts = [[{"role": "user", "content": p}] for p in prompts]
    completions = [[{"role": "assistant", "content": r}] for r in responses]
    rewards = asyncio.run(reward(prompts=chat_prompts, completions=completions, log_metric=metrics.__setitem__))
    return rewards, metrics


def openai_reward(port: int, *overrides: str, failure_budget: bool = False):
    return judge_reward(
        "judge=openai", f"judge.base_url=http://127.0.0.1:{port}/v1", *overrides, failure_budget=failure_budget
    )


TEXT = "judge.mode=text"  # the judge writes the rubric JSON


def test_openai_backend_scores_and_scores_identical_pairs_once():
    port = free_port()
    with stub_server("good", port):
        reward = openai_reward(port, "judge.model=stub", TEXT)
        rewards, metrics = score(reward, ["q1", "q1", "q2"], ["a", "a", "b"])
    assert rewards[0] == rewards[1] and all(0.2 <= r <= 1.0 for r in rewards)
    assert metrics == {"judge/failures": 0.0, "judge/requests": 2.0, "judge/unique_pairs": 2.0, "judge/cache_hits": 0.0}


def test_failed_requests_are_retried_then_succeed():
    port = free_port()
    with stub_server("flaky", port):
        reward = openai_reward(port, "judge.model=stub", "judge.retries=1", TEXT)
        rewards, metrics = score(reward, ["q1", "q2"], ["a", "b"])
    assert None not in rewards
    assert metrics["judge/requests"] == 4.0 and metrics["judge/failures"] == 0.0


@pytest.mark.parametrize("mode", ["garbage", "prose", "slow"])
def test_a_judge_that_never_answers_well_gives_none_and_counts_failures(mode):
    port = free_port()
    with stub_server(mode, port):
        reward = openai_reward(port, "judge.model=stub", "judge.retries=1", "judge.timeout=1", TEXT)
        rewards, metrics = score(reward, ["q1", "q2"], ["a", "b"])
    assert rewards == [None, None]
    assert metrics["judge/failures"] == 2.0 and metrics["judge/requests"] == 4.0


def test_refused_connection_gives_none():
    for mode in ("judge.mode=scores", TEXT):
        reward = openai_reward(free_port(), "judge.model=stub", "judge.tokenizer=tiny", "judge.retries=0", mode)
        assert score(reward, ["q"], ["a"])[0] == [None]


def test_a_dead_endpoint_stops_the_run_with_the_endpoint_named():
    port = free_port()
    reward = openai_reward(port, "judge.model=stub", "judge.tokenizer=tiny", "judge.retries=0", failure_budget=True)
    with pytest.raises(UserError, match=rf"judge.base_url=http://127.0.0.1:{port}/v1 \(judge.model=stub\) failed"):
        score(reward, ["q1", "q2"], ["a", "b"])


def test_the_failure_budget_counts_the_last_steps_of_every_process_together():
    cfg = compose_config(["reward=judge", "judge.max_failure_rate=0.5", "judge.failure_window=2"]).judge
    budget = judge_failure_budget(cfg)
    budget.spend(0, 4)
    budget.spend(4, 4)  # 4 of 8: at the limit, not past it
    budget.spend(0, 4)  # the window: the last 2 steps
    budget.spend(0, 0)  # everything from the cache: nothing asked
    with pytest.raises(UserError, match="the local judge judge.model=smollm2_135m failed to score 4 of 4 answers"):
        budget.spend(4, 4)
    never = judge_failure_budget(compose_config(["reward=judge", "judge.max_failure_rate=1.0"]).judge)
    for _ in range(3):
        never.spend(8, 8)


def test_judge_prompts_close_a_thinking_block_where_the_template_has_the_switch(tiny_policy):
    """Qwen3's chat template opens a thinking block unless enable_thinking=false: the forced score skeleton would
    land inside it. Templates without the switch ignore it."""
    _, tokenizer = tiny_policy
    qwen3_like = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    )
    conversation = [{"role": "user", "content": "Rate this."}]
    with_switch = copy.copy(tokenizer)
    with_switch.chat_template = qwen3_like
    assert chat_prompt(with_switch, conversation).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert chat_prompt(tokenizer, conversation) == tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )


def test_the_api_key_is_sent_but_never_stored(monkeypatch):
    monkeypatch.setenv("GRPO_EXP_TEST_KEY", "sk-secret-123")
    settings = judge_settings("judge=openai", "judge.model=stub", "judge.api_key_env=GRPO_EXP_TEST_KEY")
    assert "sk-secret-123" not in json.dumps(settings)


def test_local_backend_in_text_mode_fails_where_the_model_writes_no_json():
    reward = judge_reward("judge=local", "judge.model=tiny", "judge.max_new_tokens=8", "judge.retries=1", TEXT)
    rewards, metrics = score(reward, ["q1", "q2", "q1"], ["a", "b", "a"])
    # A random tiny model never writes rubric JSON: every pair fails, is retried once, and is skipped.
    assert rewards == [None, None, None]
    assert metrics == {"judge/failures": 2.0, "judge/requests": 4.0, "judge/unique_pairs": 2.0, "judge/cache_hits": 0.0}


@pytest.mark.e2e
def test_tiny_training_with_math_format_judge_learns_from_the_judge_and_never_stores_the_key(tmp_path):
    secret = "sk-grpo-exp-test-0123456789"
    port = free_port()
    run_dir = tmp_path / "run"
    with stub_server("good", port, env={**os.environ, "expected_key": secret}):
        result = run_cli(
            *TINY_RUN,
            "reward=math+format+judge",
            *stub_judge_overrides(port),
            "judge.api_key_env=GRPO_EXP_TEST_KEY",
            "logger=wandb",
            "eval.before=false",
            f"hydra.run.dir={run_dir}",
            env={"GRPO_EXP_TEST_KEY": secret},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rewards/judge/mean" in m]
    assert len(steps) == 2
    # No failures: the server, which refuses requests without the key, got it on every request.
    assert all(m["judge/failures"] == 0 and 0.2 <= m["rewards/judge/mean"] <= 1.0 for m in steps)
    assert any(m["grad_norm"] > 0 for m in steps)  # the judge's spread within groups drives the update
    # ...and the key is nowhere in the run: config, logs, metrics, Hydra's records, the W&B run.
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in result.stdout + result.stderr


@pytest.mark.e2e
def test_tiny_training_with_the_local_judge_runs_end_to_end(tmp_path):

    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY_RUN,
        "reward=math+format+judge",
        "judge=local",
        "judge.model=tiny",
        "logger=none",
        "eval.before=false",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "judge/failures" in m]
    # Even a random model scores every pair (score tokens), and the per-step judge statistics are logged.
    assert len(steps) == 2 and all(m["judge/failures"] == 0 and 0.2 <= m["rewards/judge/mean"] <= 1 for m in steps)
    assert all("judge/group_std" in m and "judge/auroc" in m and "rewards/judge/imputed" in m for m in steps)


def _llama_config_dir(directory, **architecture):
    """A model directory with its config only: the frozen-copies check reads no weights."""
    from transformers import LlamaConfig

    LlamaConfig(**architecture).save_pretrained(directory)
    return directory


def test_a_local_judge_too_big_for_a_copy_per_process_is_refused_before_anything_loads(tmp_path):
    # Llama-3.1-405B's shape (~400B parameters, ~750 GiB in bfloat16): no machine here holds two copies
    huge = _llama_config_dir(
        tmp_path / "huge",
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    cfg = compose_config(["reward=math+judge", "judge=local", f"judge.model={huge}", "judge.dtype=bfloat16"])
    with pytest.raises(UserError, match=rf"judge.model={huge} loads on every process \(\d+\.\d GiB in bfloat16\)"):
        resolve(cfg, processes=2)
    resolve(cfg, processes=1)  # one copy: the user's call (it may still not fit, as with any model)
    small = _llama_config_dir(tmp_path / "small", hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    resolve(compose_config(["reward=math+judge", "judge=local", f"judge.model={small}"]), processes=2)
