"""The LLM judge reward: a rubric scorer of (prompt, response) pairs, served locally or by an OpenAI-compatible API.

One step's pairs are deduplicated, put to the judge together (a batched generation locally; concurrent
requests, bounded by judge.concurrency, for an endpoint), and every reply that fails (not rubric JSON,
a score out of range, a timeout, a refused connection) is retried up to judge.retries times; what still
fails scores None, so TRL skips it for this component, and is counted in judge/failures.
"""

import asyncio
import logging
import os

from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.generation import generate_completions
from grpo_exp.models import check_reachable, load_model, load_tokenizer, model_option_config
from grpo_exp.rewards.rubric import parse_rubric_reply, rubric_messages
from grpo_exp.schema import JudgeBackend, JudgeSchema
from grpo_exp.text import completion_text, prompt_text

log = logging.getLogger(__name__)
PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers accept any key


class LocalJudge:
    """A frozen model in this process; loaded on first use, then kept."""

    def __init__(self, cfg: DictConfig, cache_dir: str):
        self.cfg, self.cache_dir = cfg, cache_dir
        self.model_cfg = model_option_config(cfg.model)
        self._model = self._tokenizer = None

    def _load(self):
        log.info("Loading the judge model %s", self.cfg.model)
        self._tokenizer = load_tokenizer(self.model_cfg, self.cache_dir)
        self._model = load_model(self.model_cfg, self._tokenizer, self.cache_dir, seed=0).eval().requires_grad_(False)

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        if self._model is None:
            self._load()
        # The rubric JSON is flat: generation can stop at its closing brace instead of running to the limit.
        return generate_completions(
            self._model,
            self._tokenizer,
            conversations,
            self.cfg.max_new_tokens,
            self.cfg.batch_size,
            None,
            temperature,
            stop_strings=["}"],
        )


class OpenAIJudge:
    """Any OpenAI-compatible chat endpoint; one step's requests run concurrently, at most judge.concurrency at once."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        from openai import AsyncOpenAI, OpenAIError

        # The key is read here, at call time, and handed to the client only: it never enters a config or a log.
        api_key = os.environ.get(self.cfg.api_key_env or "", "") or PLACEHOLDER_KEY
        limit = asyncio.Semaphore(self.cfg.concurrency)
        # A client per call: TRL may run each step's rewards on a different event loop.
        async with AsyncOpenAI(
            base_url=self.cfg.base_url, api_key=api_key, timeout=self.cfg.timeout, max_retries=0
        ) as client:

            async def one(messages: list[dict]) -> str | None:
                async with limit:
                    try:
                        reply = await client.chat.completions.create(
                            model=self.cfg.model,
                            messages=messages,
                            max_tokens=self.cfg.max_new_tokens,
                            temperature=temperature,
                        )
                        return reply.choices[0].message.content if reply.choices else None
                    except (TimeoutError, OpenAIError, ValueError) as err:
                        log.debug("judge request failed: %s", type(err).__name__)
                        return None

            return list(await asyncio.gather(*(one(m) for m in conversations)))


def build_judge(cfg: DictConfig, cache_dir: str) -> LocalJudge | OpenAIJudge:
    """The judge client, with what the schema cannot check checked (cheap: no model is loaded, no request sent)."""
    if cfg.backend is JudgeBackend.openai:
        for key in ("model", "base_url"):
            if not cfg[key]:
                raise UserError(f"judge.{key} is required with judge=openai")
        return OpenAIJudge(cfg)
    judge = LocalJudge(cfg, cache_dir)
    check_reachable(judge.model_cfg)
    return judge


async def score_pairs(judge, cfg: DictConfig, pairs: list[tuple[str, str]]) -> tuple[list[float | None], int]:
    """Rubric scores of distinct (prompt, response) pairs, retrying failed replies; returns (scores, attempts)."""
    scores: list[float | None] = [None] * len(pairs)
    pending = list(range(len(pairs)))
    attempts = 0
    for attempt in range(1 + cfg.retries):
        if not pending:
            break
        conversations = [rubric_messages(cfg.rubric.system_prompt, cfg.rubric.template, *pairs[i]) for i in pending]
        # Greedy (or as configured) first; a retry of the same greedy request would give the same reply.
        temperature = cfg.temperature if attempt == 0 else max(cfg.temperature, cfg.retry_temperature)
        replies = await judge.complete(conversations, temperature)
        attempts += len(pending)
        for index, reply in zip(pending, replies, strict=True):
            scores[index] = parse_rubric_reply(reply)
        pending = [i for i in pending if scores[i] is None]
    return scores, attempts


def make_judge_reward(scorer: dict, cache_dir: str):
    """The `judge` component; `scorer` is the `judge` config group (see conf/reward/judge.yaml)."""
    cfg = OmegaConf.merge(OmegaConf.structured(JudgeSchema), scorer)
    judge = build_judge(cfg, cache_dir)

    async def judge_reward(prompts, completions, log_metric=None, **kwargs) -> list[float | None]:
        pairs = [(prompt_text(p), completion_text(c)) for p, c in zip(prompts, completions, strict=True)]
        unique = list(dict.fromkeys(pairs))  # identical pairs in a step are scored once
        scores, attempts = await score_pairs(judge, cfg, unique)
        by_pair = dict(zip(unique, scores, strict=True))
        if log_metric is not None:
            log_metric("judge/failures", float(sum(s is None for s in scores)))
            log_metric("judge/requests", float(attempts))
            log_metric("judge/unique_pairs", float(len(unique)))
        return [by_pair[pair] for pair in pairs]

    judge_reward.__name__ = "judge"  # TRL logs rewards/judge/mean
    return judge_reward
