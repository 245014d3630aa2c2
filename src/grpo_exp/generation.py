"""Batched generation helpers: left-padded eval mode, completions for chat prompts (greedy or sampled), a prompt's
token ids, the name a model takes its KV cache under, and the distinct rows and positions a shared prefill needs."""

import inspect
from collections.abc import Callable
from contextlib import contextmanager

import torch
from tqdm.auto import tqdm

from grpo_exp.data_parallel import map_over_processes

# The policy's answers to chat prompts at a temperature (0: greedy), shown as `desc` (None: no progress bar), every
# process getting all of them: how a run answers (grpo_exp.run.heldout.policy_answers: its vLLM engine, else the
# policy's prepacked copy, else generate()), handed to the measures that put the policy's own answers to it.
PolicyAnswers = Callable[[list, float, str | None], list[str]]


@contextmanager
def left_padded_eval(model, tokenizer):
    """Eval mode and left padding (batched generation / last-token scoring), restored afterwards."""
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        yield
    finally:
        model.train(was_training)
        tokenizer.padding_side = padding_side


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    batch_size: int,
    desc: str | None,
    temperature: float = 0.0,
    stop_strings: list[str] | None = None,
    split: bool = False,
) -> list[str]:
    """Completions for chat prompts, batched with left padding: greedy at temperature 0, else sampled.

    Generation of a sequence ends at EOS or at the first of `stop_strings` (kept in the text). split: every
    process of the run generates its share of the prompts and gets all completions (evaluation)."""
    if split:
        return map_over_processes(
            list(prompts),
            batch_size,
            lambda share, main: generate_completions(
                model, tokenizer, share, max_new_tokens, batch_size, desc if main else None, temperature, stop_strings
            ),
        )
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    completions: list[str] = []
    with left_padded_eval(model, tokenizer):
        for start in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch", disable=desc is None):
            batch = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            output = model.generate(
                **batch,
                do_sample=temperature > 0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                temperature=temperature or None,
                top_p=None,
                top_k=None,
                stop_strings=stop_strings,
                tokenizer=tokenizer if stop_strings else None,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return completions


def prompt_ids(tokenizer, prompt) -> list[int]:
    """A prompt's token ids, as its chat template renders it (a conversational prompt) or as it is (a text one)."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]


def cache_argument(model) -> str:
    """The name under which `model`'s forward (and generate()) take a KV cache: `cache` from transformers 5.24,
    `past_key_values` before (still read there, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a [B, L] tensor: the index of one row of each distinct row, and each row's distinct row (so that a
    prefill of the distinct rows, index-selected by the second, serves every row)."""
    distinct, row_of = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.tensor([row_of.tolist().index(d) for d in range(len(distinct))])
    return first, row_of


def read_positions(mask: torch.Tensor) -> torch.Tensor:
    """generate()'s positions for an attention mask: counted over the columns read (a masked column's is 1, and
    never used)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
