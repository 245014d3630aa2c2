"""The LLM judge: a rubric scorer of (prompt, response) pairs, served locally or by an OpenAI-compatible API.

Two modes (judge.mode):
- `scores` (default): the reply is forced open at each criterion's score (`{"accuracy": `, `{"grammar": `...)
  and the score is read as the judge's probability distribution over the score tokens "1".."5" there (G-Eval style
  expected value). A score exists by construction: no parse failure is possible. Locally it is two passes
  per batch, no generate(): a group's shared opening once, then each response with the criteria's openings
  as masked branches; through an endpoint, the same prompts as /v1/completions requests with max_tokens=1 and
  logprobs, the chat template rendered here (judge.tokenizer) so that both backends read the same tokens.
- `text`: the judge writes the rubric JSON (with the server's structured output where it has one), which is
  parsed; a reply that fails is retried up to judge.retries times, then scores None.

The criteria and the score range are the rubric's (judge.rubric: conf/judge/rubric/quality.yaml, Data-Juicer's
four 1-5 scores, or the user's own; grpo_exp.rewards.rubric). One step's pairs are deduplicated, and scores are
cached across steps by (prompt, response). A pair that cannot be scored (endpoint down, timeout) is None; the
trainer then gives it its group's mean for this component (grpo_exp.trainer.seam), so that a failure moves no
sample against its group mates.
"""

import asyncio
import logging
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field

from omegaconf import MISSING, DictConfig

from grpo_exp.config_rules import OnlyWith, mix
from grpo_exp.errors import UserError
from grpo_exp.failure_budget import FailureBudget
from grpo_exp.rewards.components import reward_component
from grpo_exp.rewards.rubric import (
    Rubric,
    check_rubric,
    expected_score,
    parse_rubric_reply,
    rubric_messages,
    rubric_of,
    rubric_reward,
    score_position,
)
from grpo_exp.schema import JudgeBackend, JudgeMode, StructuredOutput
from grpo_exp.text import completion_text, prompt_text

log = logging.getLogger(__name__)
PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers accept any key
TOP_LOGPROBS = 20  # enough for the (at most ten) score tokens; vLLM's default limit


class LocalJudge:
    """A frozen model in this process; loaded on first use, then kept. (grpo_exp.models and the modules that run the
    model import torch and transformers: they are imported where a judge is made, not where the judge component is
    only named, as by --help and --cfg.)"""

    def __init__(self, cfg: DictConfig, cache_dir: str):
        from grpo_exp.models import model_option_config

        self.cfg, self.cache_dir, self.rubric = cfg, cache_dir, rubric_of(cfg)
        self.model_cfg = model_option_config(cfg.model)
        if cfg.dtype is not None:
            self.model_cfg.dtype = cfg.dtype
        self._model = self.tokenizer = None

    def _load(self):
        from grpo_exp.models import load_frozen, load_tokenizer

        if self._model is None:
            log.info("Loading the judge model %s", self.cfg.model)
            self.tokenizer = load_tokenizer(self.model_cfg, self.cache_dir)
            self._model = load_frozen(self.model_cfg, self.tokenizer, self.cache_dir)

    async def score_tokens(self, conversations: list[list[dict]], groups: list[str]) -> list[list[float] | None]:
        """`groups`: the question each conversation judges; a group's shared opening is read once."""
        from grpo_exp.rewards.score_tokens import score_tokens_locally

        self._load()
        prompts = [chat_prompt(self.tokenizer, c) for c in conversations]
        return score_tokens_locally(self._model, self.tokenizer, prompts, self.cfg.batch_size, groups, self.rubric)

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        from grpo_exp.generation import generate_completions

        self._load()
        # The rubric JSON is flat: generation can stop at its closing brace instead of running to the limit.
        return generate_completions(
            self._model,
            self.tokenizer,
            conversations,
            self.cfg.max_new_tokens,
            self.cfg.batch_size,
            None,
            temperature,
            stop_strings=["}"],
        )


def chat_prompt(tokenizer, conversation: list[dict]) -> str:
    """The judge's prompt, ready for the forced score skeleton. enable_thinking=False: templates with a thinking
    switch (Qwen3) close the thinking block, instead of opening it where the skeleton goes; others ignore it."""
    return tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


class OpenAIJudge:
    """Any OpenAI-compatible endpoint; one step's requests run concurrently, at most judge.concurrency at once."""

    def __init__(self, cfg: DictConfig, cache_dir: str):
        from grpo_exp.models import model_option_config

        self.cfg, self.cache_dir, self.rubric = cfg, cache_dir, rubric_of(cfg)
        # scores mode renders the chat template here: the tokenizer of the served model (judge.tokenizer).
        self.tokenizer_cfg = model_option_config(cfg.tokenizer or cfg.model, "judge.tokenizer")
        self.tokenizer = None

    def _client(self):
        from openai import AsyncOpenAI

        # The key is read here, at call time, and handed to the client only: it never enters a config or a log.
        api_key = os.environ.get(self.cfg.api_key_env or "", "") or PLACEHOLDER_KEY
        # A client per call: TRL may run each step's rewards on a different event loop.
        return AsyncOpenAI(base_url=self.cfg.base_url, api_key=api_key, timeout=self.cfg.timeout, max_retries=0)

    async def score_tokens(self, conversations: list[list[dict]], groups: list[str]) -> list[list[float] | None]:
        """`groups` is not needed here: servers reuse shared prompt openings themselves (vLLM's prefix caching,
        llama.cpp's prompt cache)."""
        from openai import OpenAIError

        from grpo_exp.models import load_tokenizer

        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_cfg, self.cache_dir)
        limit = asyncio.Semaphore(self.cfg.concurrency)
        async with self._client() as client:

            async def position(prompt: str, criterion: str) -> float | None:
                async with limit:
                    try:
                        reply = await client.completions.create(
                            model=self.cfg.model,
                            prompt=prompt + score_position(criterion),
                            max_tokens=1,
                            temperature=0.0,
                            logprobs=TOP_LOGPROBS,
                        )
                        top = reply.choices[0].logprobs.top_logprobs[0]
                    except (TimeoutError, OpenAIError, ValueError, AttributeError, IndexError, TypeError) as err:
                        log.debug("judge request failed: %s", type(err).__name__)
                        return None
                # None: no score token among the top logprobs
                return expected_score(_score_probabilities(top, self.rubric), self.rubric)

            async def one(conversation: list[dict]) -> list[float] | None:
                prompt = chat_prompt(self.tokenizer, conversation)
                found = await asyncio.gather(*(position(prompt, c) for c in self.rubric.criteria))
                return None if None in found else list(found)

            return list(await asyncio.gather(*(one(c) for c in conversations)))

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        from openai import OpenAIError

        limit = asyncio.Semaphore(self.cfg.concurrency)
        extra = _response_format(self.cfg.response_format, self.rubric)
        async with self._client() as client:

            async def one(messages: list[dict]) -> str | None:
                async with limit:
                    try:
                        reply = await client.chat.completions.create(
                            model=self.cfg.model,
                            messages=messages,
                            max_tokens=self.cfg.max_new_tokens,
                            temperature=temperature,
                            **extra,
                        )
                        return reply.choices[0].message.content if reply.choices else None
                    except (TimeoutError, OpenAIError, ValueError) as err:
                        log.debug("judge request failed: %s", type(err).__name__)
                        return None

            return list(await asyncio.gather(*(one(m) for m in conversations)))


def _score_probabilities(top_logprobs: dict[str, float], rubric: Rubric) -> list[float]:
    """P of each score token among an endpoint's top logprobs (token text, a leading space allowed; 0 if absent)."""
    probabilities = dict.fromkeys(rubric.score_tokens, 0.0)
    for token, logprob in top_logprobs.items():
        if token.strip() in probabilities:
            probabilities[token.strip()] += math.exp(logprob)
    return list(probabilities.values())


def _response_format(kind: StructuredOutput, rubric: Rubric) -> dict:
    """Structured output for free-text mode: OpenAI's / vLLM's json_schema, or llama.cpp's json_object + schema."""
    schema = rubric.reply_schema
    if kind is StructuredOutput.json_schema:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "rubric", "schema": schema}}}
    if kind is StructuredOutput.json_object:
        return {"response_format": {"type": "json_object", "schema": schema}}
    return {}


@dataclass
class RubricJudge:
    """The judge a run builds once: the `judge` reward and held-out evaluation share it (and its cache)."""

    cfg: DictConfig
    backend: LocalJudge | OpenAIJudge
    cache: OrderedDict = field(default_factory=OrderedDict)

    @property
    def rubric(self) -> Rubric:
        return self.backend.rubric

    async def score(self, pairs: list[tuple[str, str]]) -> tuple[list[float | None], dict[str, float]]:
        """Rewards (mean score / highest score) of (prompt, response) pairs, in order, and this call's counters."""
        unique = list(dict.fromkeys(pairs))  # identical pairs in a step are scored once
        todo = [pair for pair in unique if pair not in self.cache]
        scores, requests = await self._score_new(todo) if todo else ([], 0)
        found = dict(zip(todo, scores, strict=True))
        rewards = [self.cache[p] if p in self.cache else found[p] for p in pairs]
        self._remember(unique, found)
        counters = {
            "judge/failures": float(sum(s is None for s in scores)),
            "judge/requests": float(requests),
            "judge/unique_pairs": float(len(unique)),
            "judge/cache_hits": float(len(unique) - len(todo)),
        }
        return rewards, counters

    async def _score_new(self, pairs: list[tuple[str, str]]) -> tuple[list[float | None], int]:
        conversations = [rubric_messages(self.cfg.rubric.system_prompt, self.cfg.rubric.template, *p) for p in pairs]
        if self.cfg.mode is JudgeMode.scores:
            found = await self.backend.score_tokens(conversations, groups=[prompt for prompt, _ in pairs])
            return [None if s is None else rubric_reward(s, self.rubric) for s in found], len(pairs)
        cfg, scores = self.cfg, [None] * len(pairs)
        pending, requests = list(range(len(pairs))), 0
        for attempt in range(1 + cfg.retries):
            if not pending:
                break
            # Greedy (or as configured) first; a retry of the same greedy request would give the same reply.
            temperature = cfg.temperature if attempt == 0 else max(cfg.temperature, cfg.retry_temperature)
            replies = await self.backend.complete([conversations[i] for i in pending], temperature)
            requests += len(pending)
            for index, reply in zip(pending, replies, strict=True):
                scores[index] = parse_rubric_reply(reply, self.rubric)
            pending = [i for i in pending if scores[i] is None]
        return scores, requests

    def _remember(self, used: list[tuple[str, str]], found: dict[tuple[str, str], float | None]) -> None:
        """Least recently used out first; a failure is not kept (it is tried again next time)."""
        self.cache.update((pair, value) for pair, value in found.items() if value is not None)
        for pair in used:
            if pair in self.cache:
                self.cache.move_to_end(pair)
        while len(self.cache) > self.cfg.cache_size:
            self.cache.popitem(last=False)


def check_judge(cfg: DictConfig, processes: int = 1) -> None:
    """What the schema cannot check of the judge (the resolve phase; no model is loaded, no request sent): the
    rubric, an endpoint's settings, and the model (or the endpoint's tokenizer, in scores mode) found; a local judge's
    copies, one per process, must fit."""
    from grpo_exp.models import check_frozen_copies, check_reachable

    check_rubric(cfg)
    if cfg.backend is JudgeBackend.openai:
        for key in ("model", "base_url"):
            if not cfg[key]:
                raise UserError(f"judge.{key} is required with judge=openai")
        if cfg.mode is JudgeMode.scores:
            check_reachable(OpenAIJudge(cfg, "").tokenizer_cfg)
        return
    model_cfg = LocalJudge(cfg, "").model_cfg
    check_reachable(model_cfg)
    check_frozen_copies(model_cfg, "judge.model", processes)


def build_judge(cfg: DictConfig, cache_dir: str) -> RubricJudge:
    """The judge (cheap: the model loads, or the endpoint is asked, at the first score)."""
    backend = OpenAIJudge(cfg, cache_dir) if cfg.backend is JudgeBackend.openai else LocalJudge(cfg, cache_dir)
    return RubricJudge(cfg, backend)


def judge_failure_budget(cfg: DictConfig) -> FailureBudget:
    """judge.max_failure_rate: the share of pairs the judge failed to score over the last judge.failure_window
    steps, every process's pairs together."""
    if cfg.backend is JudgeBackend.openai:
        name = f"the judge at judge.base_url={cfg.base_url} (judge.model={cfg.model})"
        hint = "is it up, and does it serve that model? (judge.timeout, judge.retries)"
    else:
        name = f"the local judge judge.model={cfg.model}"
        hint = "in judge.mode=text its replies did not parse (judge.mode=scores always scores)"

    def describe(failed: float, total: float, steps: int) -> str:
        return (
            f"{name} failed to score {failed:.0f} of {total:.0f} answers over the last {steps} step(s), more than "
            f"judge.max_failure_rate={cfg.max_failure_rate}: {hint}; judge.max_failure_rate=1.0 never stops"
        )

    return FailureBudget(cfg.max_failure_rate, cfg.failure_window, describe)


@dataclass
class JudgeReward:
    # The judge itself is the `judge` config group (judge=local | judge=openai).
    weight: float = MISSING


def _check_in_run(settings: DictConfig, cfg: DictConfig, processes: int) -> None:
    check_judge(cfg.judge, processes)


@reward_component("judge", JudgeReward, graded=True, check=_check_in_run)
def make_judge_reward(judge: RubricJudge):
    """The `judge` component: the run's judge (grpo_exp.run.build), with the judge config group's settings."""
    budget = judge_failure_budget(judge.cfg)

    async def judge_reward(prompts, completions, log_metric=None, **kwargs) -> list[float | None]:
        pairs = [(prompt_text(p), completion_text(c)) for p, c in zip(prompts, completions, strict=True)]
        rewards, counters = await judge.score(pairs)
        if log_metric is not None:
            for key, value in counters.items():
                log_metric(key, value)
        asked = counters["judge/unique_pairs"] - counters["judge/cache_hits"]
        budget.spend(counters["judge/failures"], asked)
        return rewards

    judge_reward.__name__ = "judge"  # TRL logs rewards/judge/mean
    return judge_reward


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("judge",),
        lambda cfg: "judge" in mix(cfg),
        "by the judge, a component of the reward mix (reward=...+judge)",
        lambda cfg: f"this run's reward={'+'.join(mix(cfg))} has no judge",
        lambda cfg: f"add it to the mix (reward={'+'.join(mix(cfg))}+judge)",
    ),
    OnlyWith(
        ("judge.dtype", "judge.batch_size"),
        lambda cfg: cfg.judge.backend is JudgeBackend.local,
        "by a local judge (judge=local)",
        lambda cfg: f"judge.backend={cfg.judge.backend.value} asks an endpoint",
        "use judge=local",
    ),
    OnlyWith(
        ("judge.base_url", "judge.api_key_env", "judge.concurrency", "judge.timeout"),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai,
        "by a judge behind an endpoint (judge=openai)",
        lambda cfg: f"judge.backend={cfg.judge.backend.value} loads the judge in-process",
        "use judge=openai",
    ),
    OnlyWith(
        ("judge.tokenizer",),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai and cfg.judge.mode is JudgeMode.scores,
        "by a judge behind an endpoint in judge.mode=scores (it renders the prompt)",
        lambda cfg: f"this run's judge has judge.backend={cfg.judge.backend.value}, judge.mode={cfg.judge.mode.value}",
        "use judge=openai with judge.mode=scores",
    ),
    OnlyWith(
        ("judge.max_new_tokens", "judge.temperature", "judge.retry_temperature", "judge.retries"),
        lambda cfg: cfg.judge.mode is JudgeMode.text,
        "when the judge writes its reply (judge.mode=text)",
        lambda cfg: "judge.mode=scores reads the score tokens' probabilities, writing nothing",
        "set judge.mode=text too",
    ),
    OnlyWith(
        ("judge.response_format",),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai and cfg.judge.mode is JudgeMode.text,
        "by a judge behind an endpoint writing its reply (judge=openai, judge.mode=text)",
        lambda cfg: f"this run's judge has judge.backend={cfg.judge.backend.value}, judge.mode={cfg.judge.mode.value}",
        "use judge=openai with judge.mode=text",
    ),
)
