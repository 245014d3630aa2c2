"""The LLM judge: a rubric scorer of (prompt, response) pairs, served locally or by an OpenAI-compatible API.

Two modes (judge.mode):
- `scores` (default): the reply is forced open at each criterion's score (`{"accuracy": `, `{"grammar": `...)
  and the score is read as the judge's probability distribution over the tokens "1".."5" there (G-Eval style
  expected value). A score exists by construction: no parse failure is possible. Locally it is two passes
  per batch, no generate(): a group's shared opening once, then each response with the four criteria's openings
  as masked branches; through an endpoint, the same prompts as /v1/completions requests with max_tokens=1 and
  logprobs, the chat template rendered here (judge.tokenizer) so that both backends read the same tokens.
- `text`: the judge writes the rubric JSON (with the server's structured output where it has one), which is
  parsed; a reply that fails is retried up to judge.retries times, then scores None.

One step's pairs are deduplicated, and scores are cached across steps by (prompt, response). A pair that
cannot be scored (endpoint down, timeout) is None; the trainer then gives it its group's mean for this
component (grpo_exp.trainer.seam), so that a failure moves no sample against its group mates.
"""

import asyncio
import logging
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from grpo_exp.errors import UserError
from grpo_exp.generation import generate_completions, left_padded_eval
from grpo_exp.models import check_reachable, load_model, load_tokenizer, model_option_config
from grpo_exp.rewards.rubric import (
    CRITERIA,
    REPLY_SCHEMA,
    SCORE_TOKENS,
    expected_score,
    parse_rubric_reply,
    rubric_messages,
    rubric_reward,
    score_position,
)
from grpo_exp.schema import JudgeBackend, JudgeMode
from grpo_exp.text import completion_text, prompt_text

log = logging.getLogger(__name__)
PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers accept any key
TOP_LOGPROBS = 20  # enough for the five score tokens; vLLM's default limit
# Attention implementations that take a custom 4D mask (the local scorer's branches share one pass through it).
MASKABLE_ATTENTION = ("sdpa", "eager")


def score_token_ids(tokenizer, prefix: str) -> list[int]:
    """The token of each score "1".."5" where the reply is opened at a score: it must extend the prefix by exactly
    one token."""
    base = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = []
    for token in SCORE_TOKENS:
        extended = tokenizer(prefix + token, add_special_tokens=False)["input_ids"]
        if extended[: len(base)] != base or len(extended) != len(base) + 1:
            raise UserError(f"judge.mode=scores: the judge's tokenizer does not write score {token} as one token")
        ids.append(extended[-1])
    return ids


@torch.no_grad()
def score_tokens_locally(
    model, tokenizer, prompts: list[str], batch_size: int, groups: list[str] | None = None
) -> list[list[float]]:
    """Each criterion's expected score for chat-templated judge prompts (ending where the reply starts).

    Prompts with the same `groups` key (the question a group of completions answers) share their opening: the
    rubric's instructions and the question. That opening is read once per group; then one pass reads each prompt's
    own rest and, as branches after it, the reply opened at every criterion's score."""
    digits = score_token_ids(tokenizer, prompts[0] + score_position(CRITERIA[0]))
    groups = groups or list(range(len(prompts)))
    scores: list[list[float]] = []
    with left_padded_eval(model, tokenizer):
        for start in range(0, len(prompts), batch_size):
            chunk = slice(start, start + batch_size)
            scores += _score_batch(model, tokenizer, prompts[chunk], groups[chunk], digits)
    return scores


def _score_batch(model, tokenizer, prompts: list[str], groups: list, digits: list[int]) -> list[list[float]]:
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    branches = [tokenizer([p + score_position(c) for c in CRITERIA], add_special_tokens=False)["input_ids"]
                for p in prompts]  # fmt: skip
    if not all(b[: len(p)] == p for p, row in zip(prompt_ids, branches, strict=True) for b in row) or (
        model.config._attn_implementation not in MASKABLE_ATTENTION
    ):  # a tokenizer that merges across the prompt's end, or no custom masks: read every branch whole
        batch = tokenizer.pad({"input_ids": [b for row in branches for b in row]}, return_tensors="pt")
        last = _forward(model, batch.to(model.device))[0]
    else:
        keys = list(dict.fromkeys(groups))
        group_of = [keys.index(g) for g in groups]
        openings = [_common_prefix([p for p, k in zip(prompt_ids, group_of, strict=True) if k == key])
                    for key in range(len(keys))]  # fmt: skip
        cache, mask = _forward(model, tokenizer.pad({"input_ids": openings}, return_tensors="pt").to(model.device))[1:]
        rows = torch.tensor(group_of, device=model.device)
        cache.batch_select_indices(rows)
        rests = [p[len(openings[k]) :] for p, k in zip(prompt_ids, group_of, strict=True)]
        tails = [[b[len(p) :] for b in row] for p, row in zip(prompt_ids, branches, strict=True)]
        last = _read_branches(model, cache, mask[rows], rests, tails, tokenizer.pad_token_id)
    probabilities = torch.softmax(last[:, digits].float(), dim=-1).tolist()
    expected = [expected_score(p) for p in probabilities]
    return [expected[i : i + len(CRITERIA)] for i in range(0, len(expected), len(CRITERIA))]


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    """The longest opening all sequences share, less one token: each keeps a token of its own to read."""
    shortest = min(len(s) for s in sequences)
    length = next((i for i in range(shortest) if len({s[i] for s in sequences}) > 1), shortest)
    return sequences[0][: min(length, shortest - 1)]


def _forward(model, batch):
    """Left-padded sequences read from scratch: the last position's logits, the cache and its attention mask."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # left padding: real tokens count from 0
    out = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions, use_cache=True,
                logits_to_keep=1)  # fmt: skip
    return out.logits[:, -1, :], out.past_key_values, mask


def _read_branches(model, cache, cached_mask, rests, tails, pad: int) -> torch.Tensor:
    """Each row's cached opening continued by its rest, then by each of its branches (the criteria's openings of
    the reply), all in one pass: a branch sees the cache, its row's rest and itself, never another branch, so the
    cache is not copied per branch. The logits at each branch's end, row-major.

    Columns: the rests left-padded to one width, then branch k of every row right-padded to branch k's width."""
    rows, widths = len(rests), [max(len(row[k]) for row in tails) for k in range(len(tails[0]))]
    rest_width = max(len(r) for r in rests)
    ids = torch.full((rows, rest_width + sum(widths)), pad, dtype=torch.long)
    segment = torch.full(ids.shape, -1)  # -1: padding, 0: the rest, k + 1: branch k
    positions = torch.zeros(ids.shape, dtype=torch.long)
    ends = []
    for i, (rest, branches) in enumerate(zip(rests, tails, strict=True)):
        start, base = rest_width - len(rest), int(cached_mask[i].sum())
        ids[i, start:rest_width], segment[i, start:rest_width] = torch.tensor(rest, dtype=torch.long), 0
        positions[i, start:rest_width] = base + torch.arange(len(rest))
        column = rest_width
        for k, (branch, width) in enumerate(zip(branches, widths, strict=True)):
            ids[i, column : column + len(branch)] = torch.tensor(branch, dtype=torch.long)
            segment[i, column : column + len(branch)] = k + 1
            positions[i, column : column + len(branch)] = base + len(rest) + torch.arange(len(branch))
            ends.append((i, column + len(branch) - 1))
            column += width
    new = segment.shape[1]
    causal = torch.ones(new, new, dtype=torch.bool).tril()
    same_or_rest = (segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])
    sees_new = causal & same_or_rest & (segment[:, None, :] >= 0) | torch.eye(new, dtype=torch.bool)  # pads: self
    sees_cache = cached_mask.bool().cpu()[:, None, :].expand(rows, new, -1)
    allowed = torch.cat([sees_cache, sees_new], dim=2)[:, None]  # (rows, 1, new, cached + new)
    additive = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, torch.finfo(model.dtype).min)
    keep = sorted({column for _, column in ends})  # the vocabulary projection only where a branch ends
    out = model(input_ids=ids.to(model.device), attention_mask=additive.to(model.device),
                position_ids=positions.to(model.device), past_key_values=cache,
                logits_to_keep=torch.tensor(keep, device=model.device))  # fmt: skip
    return torch.stack([out.logits[i, keep.index(column)] for i, column in ends])


class LocalJudge:
    """A frozen model in this process; loaded on first use, then kept."""

    def __init__(self, cfg: DictConfig, cache_dir: str):
        self.cfg, self.cache_dir = cfg, cache_dir
        self.model_cfg = model_option_config(cfg.model)
        if cfg.dtype is not None:
            self.model_cfg.dtype = cfg.dtype
        self._model = self.tokenizer = None

    def _load(self):
        if self._model is None:
            log.info("Loading the judge model %s", self.cfg.model)
            self.tokenizer = load_tokenizer(self.model_cfg, self.cache_dir)
            model = load_model(self.model_cfg, self.tokenizer, self.cache_dir, seed=0)
            self._model = model.eval().requires_grad_(False)

    async def score_tokens(self, conversations: list[list[dict]], groups: list[str]) -> list[list[float] | None]:
        """`groups`: the question each conversation judges; a group's shared opening is read once."""
        self._load()
        prompts = [chat_prompt(self.tokenizer, c) for c in conversations]
        return score_tokens_locally(self._model, self.tokenizer, prompts, self.cfg.batch_size, groups)

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        self._load()
        # The rubric JSON is flat: generation can stop at its closing brace instead of running to the limit.
        return generate_completions(
            self._model, self.tokenizer, conversations, self.cfg.max_new_tokens, self.cfg.batch_size, None,
            temperature, stop_strings=["}"],
        )  # fmt: skip


def chat_prompt(tokenizer, conversation: list[dict]) -> str:
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


class OpenAIJudge:
    """Any OpenAI-compatible endpoint; one step's requests run concurrently, at most judge.concurrency at once."""

    def __init__(self, cfg: DictConfig, cache_dir: str):
        self.cfg, self.cache_dir = cfg, cache_dir
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

        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_cfg, self.cache_dir)
        limit = asyncio.Semaphore(self.cfg.concurrency)
        async with self._client() as client:

            async def position(prompt: str, criterion: str) -> float | None:
                async with limit:
                    try:
                        reply = await client.completions.create(
                            model=self.cfg.model, prompt=prompt + score_position(criterion), max_tokens=1,
                            temperature=0.0, logprobs=TOP_LOGPROBS,
                        )  # fmt: skip
                        top = reply.choices[0].logprobs.top_logprobs[0]
                    except (TimeoutError, OpenAIError, ValueError, AttributeError, IndexError, TypeError) as err:
                        log.debug("judge request failed: %s", type(err).__name__)
                        return None
                return expected_score(_score_probabilities(top))  # None: no score token among the top logprobs

            async def one(conversation: list[dict]) -> list[float] | None:
                prompt = chat_prompt(self.tokenizer, conversation)
                found = await asyncio.gather(*(position(prompt, c) for c in CRITERIA))
                return None if None in found else list(found)

            return list(await asyncio.gather(*(one(c) for c in conversations)))

    async def complete(self, conversations: list[list[dict]], temperature: float) -> list[str | None]:
        from openai import OpenAIError

        limit = asyncio.Semaphore(self.cfg.concurrency)
        extra = _response_format(self.cfg.response_format)
        async with self._client() as client:

            async def one(messages: list[dict]) -> str | None:
                async with limit:
                    try:
                        reply = await client.chat.completions.create(
                            model=self.cfg.model, messages=messages, max_tokens=self.cfg.max_new_tokens,
                            temperature=temperature, **extra,
                        )  # fmt: skip
                        return reply.choices[0].message.content if reply.choices else None
                    except (TimeoutError, OpenAIError, ValueError) as err:
                        log.debug("judge request failed: %s", type(err).__name__)
                        return None

            return list(await asyncio.gather(*(one(m) for m in conversations)))


def _score_probabilities(top_logprobs: dict[str, float]) -> list[float]:
    """P of each score token among an endpoint's top logprobs (token text, a leading space allowed; 0 if absent)."""
    probabilities = dict.fromkeys(SCORE_TOKENS, 0.0)
    for token, logprob in top_logprobs.items():
        if token.strip() in probabilities:
            probabilities[token.strip()] += math.exp(logprob)
    return list(probabilities.values())


def _response_format(kind: str) -> dict:
    """Structured output for free-text mode: OpenAI's / vLLM's json_schema, or llama.cpp's json_object + schema."""
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "rubric", "schema": REPLY_SCHEMA}}}  # fmt: skip
    if kind == "json_object":
        return {"response_format": {"type": "json_object", "schema": REPLY_SCHEMA}}
    return {}


@dataclass
class RubricJudge:
    """The judge a run builds once: the `judge` reward and held-out evaluation share it (and its cache)."""

    cfg: DictConfig
    backend: LocalJudge | OpenAIJudge
    cache: OrderedDict = field(default_factory=OrderedDict)

    async def score(self, pairs: list[tuple[str, str]]) -> tuple[list[float | None], dict[str, float]]:
        """Rewards (mean score / 5) of (prompt, response) pairs, in order, and this call's counters."""
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
        return rewards, counters  # fmt: skip

    async def _score_new(self, pairs: list[tuple[str, str]]) -> tuple[list[float | None], int]:
        conversations = [rubric_messages(self.cfg.rubric.system_prompt, self.cfg.rubric.template, *p) for p in pairs]
        if self.cfg.mode is JudgeMode.scores:
            found = await self.backend.score_tokens(conversations, groups=[prompt for prompt, _ in pairs])
            return [None if s is None else rubric_reward(s) for s in found], len(pairs)
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
                scores[index] = parse_rubric_reply(reply)
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


def build_judge(cfg: DictConfig, cache_dir: str) -> RubricJudge:
    """The judge, with what the schema cannot check checked (cheap: no model is loaded, no request sent)."""
    if cfg.backend is JudgeBackend.openai:
        for key in ("model", "base_url"):
            if not cfg[key]:
                raise UserError(f"judge.{key} is required with judge=openai")
        backend = OpenAIJudge(cfg, cache_dir)
        if cfg.mode is JudgeMode.scores:
            check_reachable(backend.tokenizer_cfg)
        return RubricJudge(cfg, backend)
    backend = LocalJudge(cfg, cache_dir)
    check_reachable(backend.model_cfg)
    return RubricJudge(cfg, backend)


def make_judge_reward(judge: RubricJudge):
    """The `judge` component: the run's judge (grpo_exp.run.build), with the judge config group's settings."""

    async def judge_reward(prompts, completions, log_metric=None, **kwargs) -> list[float | None]:
        pairs = [(prompt_text(p), completion_text(c)) for p, c in zip(prompts, completions, strict=True)]
        rewards, counters = await judge.score(pairs)
        if log_metric is not None:
            for key, value in counters.items():
                log_metric(key, value)
        return rewards

    judge_reward.__name__ = "judge"  # TRL logs rewards/judge/mean
    return judge_reward
