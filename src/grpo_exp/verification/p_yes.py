"""P(Yes) scorers: how sure a model is that an answer is correct (GenRM-style).

A generative verifier (`scorer=genrm` or `scorer=self`) is asked "Is the answer correct? Answer Yes or
No." and scored by P(Yes), normalised over the Yes/No tokens and read from the next-token logits of one
batched forward pass (no sampling); `genrm` uses a frozen model (by default a copy of the initial policy)
or an OpenAI-compatible endpoint that returns logprobs, `self` the current policy weights.
"""

import asyncio
import math
import os

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_exp.config_rules import OnlyWith, mix
from grpo_exp.data_parallel import map_over_processes
from grpo_exp.errors import UserError
from grpo_exp.generation import left_padded_eval
from grpo_exp.models import check_frozen_copies, check_reachable, load_frozen, load_tokenizer, model_option_config
from grpo_exp.schema import ScorerName, ScorerSchema


def yes_no_token_ids(tokenizer, yes: str, no: str) -> tuple[int, int]:
    """The first token of each word as the model would start its reply (no leading space after the chat header)."""
    yes_ids = tokenizer.encode(yes, add_special_tokens=False)
    no_ids = tokenizer.encode(no, add_special_tokens=False)
    if not yes_ids or not no_ids or yes_ids[0] == no_ids[0]:
        raise UserError(f"scorer.yes_token='{yes}' and scorer.no_token='{no}' need distinct first tokens")
    return yes_ids[0], no_ids[0]


def question_messages(template: str, question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": template.replace("{question}", question).replace("{answer}", answer)}]


def verdict_log_probabilities(model, tokenizer, conversations: list, yes_id: int, no_id: int) -> torch.Tensor:
    """log [P(Yes), P(No)], normalised over the two, at the first reply token: one forward pass (left padding;
    positions need no correction, rotary attention sees only relative ones), with gradients if enabled."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(
        model.device
    )
    # logits_to_keep=1: the LM head only at the last position (all positions: 1.4x the time, measured)
    last = model(**batch, logits_to_keep=1).logits[:, -1, :].float()
    return torch.log_softmax(torch.stack([last[:, yes_id], last[:, no_id]], dim=1), dim=1)


@torch.no_grad()
def p_yes_from_logits(model, tokenizer, conversations: list, yes_id: int, no_id: int, batch_size: int) -> list[float]:
    """P(Yes) / (P(Yes) + P(No)) of the first reply token, one forward pass per batch."""
    scores: list[float] = []
    with left_padded_eval(model, tokenizer):
        for start in range(0, len(conversations), batch_size):
            chunk = conversations[start : start + batch_size]
            scores += verdict_log_probabilities(model, tokenizer, chunk, yes_id, no_id)[:, 0].exp().tolist()
    return scores


class PYesScorer:
    """P(Yes) of a model asked whether an answer to a question is correct."""

    def __init__(self, cfg: DictConfig, policy_cfg: DictConfig, cache_dir: str):
        self.cfg, self.policy_cfg, self.cache_dir = cfg, policy_cfg, cache_dir
        self.model = self.tokenizer = None
        self.ids: tuple[int, int] | None = None
        self.split = False  # every process scores its share and gets all scores (evaluation: policy_p_yes)

    @property
    def follows_policy(self) -> bool:
        return self.cfg.name is ScorerName.self

    def bind(self, model, tokenizer) -> None:
        """Use these weights (the live policy, for scorer=self)."""
        self.model, self.tokenizer = model, tokenizer
        self.ids = yes_no_token_ids(tokenizer, self.cfg.yes_token, self.cfg.no_token)

    def _load(self) -> None:
        model_cfg = (
            self.policy_cfg
            if self.cfg.model == "initial_policy"
            else model_option_config(self.cfg.model, "scorer.model")
        )
        tokenizer = load_tokenizer(model_cfg, self.cache_dir)
        self.bind(load_frozen(model_cfg, tokenizer, self.cache_dir), tokenizer)

    def __call__(self, questions: list[str], answers: list[str]) -> list[float]:
        conversations = [question_messages(self.cfg.template, q, a) for q, a in zip(questions, answers, strict=True)]
        if self.cfg.base_url:
            return asyncio.run(self._from_endpoint(conversations))
        if self.model is None:
            if self.follows_policy:
                raise RuntimeError("scorer=self is scored with the policy: bind() it before use")
            self._load()
        if not self.split:
            return p_yes_from_logits(self.model, self.tokenizer, conversations, *self.ids, self.cfg.batch_size)
        return map_over_processes(
            conversations,
            self.cfg.batch_size,
            lambda share, _: p_yes_from_logits(self.model, self.tokenizer, share, *self.ids, self.cfg.batch_size),
        )

    async def _from_endpoint(self, conversations: list) -> list[float]:
        """P(Yes) from an OpenAI-compatible endpoint's top logprobs for the first reply token (NaN if absent)."""
        from openai import AsyncOpenAI, OpenAIError

        api_key = os.environ.get(self.cfg.api_key_env or "", "") or "not-needed"
        async with AsyncOpenAI(base_url=self.cfg.base_url, api_key=api_key, max_retries=2, timeout=60) as client:

            async def one(messages) -> float:
                try:
                    reply = await client.chat.completions.create(
                        model=self.cfg.model,
                        messages=messages,
                        max_tokens=1,
                        logprobs=True,
                        top_logprobs=20,
                        temperature=0.0,
                    )
                    top = reply.choices[0].logprobs.content[0].top_logprobs
                except (OpenAIError, AttributeError, IndexError, TypeError):
                    return math.nan
                probs = {t.token.strip(): math.exp(t.logprob) for t in top}
                yes, no = probs.get(self.cfg.yes_token, 0.0), probs.get(self.cfg.no_token, 0.0)
                return yes / (yes + no) if yes + no > 0 else math.nan

            return list(await asyncio.gather(*(one(c) for c in conversations)))


def check_scorer_reachable(scorer_cfg: DictConfig, policy_cfg: DictConfig, processes: int = 1) -> None:
    """A frozen verifier named by a model option, a directory or a hub id (not the initial policy, nor an endpoint)
    must be found, and its copies (one per process; the initial policy's too) must fit (the resolve phase)."""
    if scorer_cfg.name is not ScorerName.genrm or scorer_cfg.base_url:
        return
    if scorer_cfg.model == "initial_policy":
        check_frozen_copies(policy_cfg, "scorer.model=initial_policy: model.name_or_path", processes)
        return
    model_cfg = model_option_config(scorer_cfg.model, "scorer.model")
    check_reachable(model_cfg)
    check_frozen_copies(model_cfg, "scorer.model", processes)


def build_p_yes(scorer_cfg: DictConfig, policy_cfg: DictConfig, cache_dir: str) -> PYesScorer | None:
    """The P(Yes) scorer of scorer=genrm / scorer=self; None for scorer=none."""
    if scorer_cfg.name is ScorerName.none:
        return None
    return PYesScorer(scorer_cfg, policy_cfg, cache_dir)


def policy_p_yes(model, tokenizer, batch_size: int, template: str | None = None) -> PYesScorer:
    """These weights' own P(Yes), asked with `template` (null: the default verifier question), for evaluation:
    under several processes each scores its share."""
    settings = ScorerSchema(name=ScorerName.self, batch_size=batch_size)
    if template is not None:
        settings.template = template
    scorer = PYesScorer(OmegaConf.structured(settings), None, "")
    scorer.bind(model, tokenizer)
    scorer.split = True
    return scorer


def _needs_p_yes(cfg: DictConfig) -> bool:
    return bool({"confidence", "selfverify"} & set(mix(cfg)))


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("scorer.name",),
        _needs_p_yes,
        "by what reads a P(Yes): the reward components confidence and selfverify",
        lambda cfg: f"this run's reward={'+'.join(mix(cfg))} has neither",
        "add one to the reward mix",
    ),
    OnlyWith(
        ("scorer.template", "scorer.yes_token", "scorer.no_token", "scorer.batch_size"),
        lambda cfg: _needs_p_yes(cfg) and cfg.scorer.name is not ScorerName.none,
        "by the P(Yes) scorer of scorer=genrm or scorer=self, for the confidence and selfverify components",
        lambda cfg: (
            f"this run's reward={'+'.join(mix(cfg))} with scorer={cfg.scorer.name.value} reads none"
            if cfg.scorer.name is not ScorerName.none or not _needs_p_yes(cfg)
            else "scorer.name=none has no P(Yes) scorer (the policy's own, with its defaults, is read)"
        ),
        "use scorer=genrm or scorer=self with confidence or selfverify in the reward mix",
    ),
    OnlyWith(
        ("scorer.model", "scorer.base_url", "scorer.api_key_env"),
        lambda cfg: cfg.scorer.name is ScorerName.genrm,
        "by a frozen verifier (scorer=genrm)",
        lambda cfg: f"scorer.name={cfg.scorer.name.value}",
        "use scorer=genrm",
    ),
)
