"""A batch of trajectories whose KV cache is kept from one turn to the next (rollout.cache_turns).

Without it every turn's generate() prefills the whole context again: the system message, the demonstration and
every earlier turn, for every trajectory. Kept, a turn prefills only what is new to each trajectory: the observation
its tool answered. The first turn computes the prefix all trajectories share (the system message, the tools'
description, the demonstration) once, and each distinct prompt once for its G trajectories.

The batch is held in generate()'s own layout, one row per trajectory, every column ever fed:

    [shared prefix | pads | rest of the prompt | turn 1 + what followed its end | pads | observation 1 | turn 2 ...]

A column the trajectory does not read (padding, tokens generated after a turn's end) is masked out of attention;
generate() counts positions over the columns that are read (attention_mask.cumsum), so every token sits at the
position, and attends to exactly the tokens, that it has when its context is prefilled whole. The trajectories
are the same up to the float rounding of another summation order (tests/test_turn_cache.py: token for token under
greedy decoding).
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from grpo_exp.config_rules import OnlyWith
from grpo_exp.generation import cache_argument, distinct_rows, read_positions
from grpo_exp.masks import MASKABLE_ATTENTION
from grpo_exp.schema import ToolCalling


@dataclass
class CachedTurns:
    input_ids: torch.Tensor  # [B, L]: every column fed (or about to be fed) to the model
    attention_mask: torch.Tensor  # [B, L]: 1 where the trajectory reads the column
    cache: DynamicCache  # the keys and values of every column but the last (generate() feeds that one)

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    def generate_inputs(self, model) -> dict:
        """generate()'s arguments for the next turn of `model`."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, cache_argument(model): self.cache}


def turns_cacheable(config) -> str | None:
    """Why a model's turns cannot be cached this way; None when they can. The layout needs an attention that takes
    a mask with holes (sdpa, eager) and no sliding window (a window counts columns, masked ones included)."""
    text = config.get_text_config()
    if getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True):
        return "its attention has a sliding window"
    if config._attn_implementation not in MASKABLE_ATTENTION:
        return f"its attention ({config._attn_implementation}) does not take a mask with holes"
    return None


def common_prefix_length(contexts: list[list[int]]) -> int:
    """The number of leading tokens every context shares, leaving each at least one token of its own (generate()
    feeds each row's last token itself). Pure."""
    shortest = min(len(c) for c in contexts)
    length = 0
    while length < shortest - 1 and all(c[length] == contexts[0][length] for c in contexts):
        length += 1
    return length


def _left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


@torch.no_grad()
def first_turn(model, contexts: list[list[int]], pad: int, uniform: bool = False) -> CachedTurns:
    """The batch before its first turn: the shared prefix's keys and values computed once, then each distinct
    prompt's rest (but its last token) once, repeated for the trajectories that share it. `uniform`: one forward
    whatever the contexts (no prefix of its own), so that every process of a sharded model (ZeRO-3, FSDP: each
    forward a collective call) makes the same calls, whatever its share of the prompts."""
    device = model.device
    shared = 0 if uniform else common_prefix_length(contexts)
    rests, rest_mask = _left_padded([c[shared:] for c in contexts], pad)
    prefix = torch.tensor([contexts[0][:shared]], dtype=torch.long)
    input_ids = torch.cat([prefix.expand(len(contexts), -1), rests], dim=1).to(device)
    attention_mask = torch.cat([torch.ones(len(contexts), shared, dtype=torch.long), rest_mask], dim=1).to(device)
    cache = DynamicCache(config=model.config)
    first, row_of = distinct_rows(torch.cat([rests, rest_mask], dim=1))  # a row of each distinct rest
    if shared:
        model(input_ids=prefix.to(device), **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
        cache.batch_select_indices(torch.zeros(len(first), dtype=torch.long, device=device))  # the prefix, per rest
    if rests.shape[1] > 1:
        ids, mask = input_ids[first.to(device), :-1], attention_mask[first.to(device), :-1]
        model(
            input_ids=ids[:, shared:],
            attention_mask=mask,
            position_ids=read_positions(mask)[:, shared:],
            **{cache_argument(model): cache},
            use_cache=True,
            logits_to_keep=1,
        )
    cache.batch_select_indices(row_of.to(device))
    return CachedTurns(input_ids, attention_mask, cache)


def after_turn(batch: CachedTurns, output: torch.Tensor, kept: list[int]) -> CachedTurns:
    """The batch after generate() returned `output` ([B, L + T]; the cache now holds all its columns but the last),
    each row reading only the first kept[i] tokens it generated (the turn as cut: the rest is padding, or text
    past the turn's end)."""
    generated = output.shape[1] - batch.length
    columns = torch.arange(generated, device=output.device)
    read = (columns[None, :] < torch.tensor(kept, device=output.device)[:, None]).long()
    return CachedTurns(output, torch.cat([batch.attention_mask, read], dim=1), batch.cache)


def next_turn(batch: CachedTurns, rows: list[int], observations: list[list[int]], pad: int) -> CachedTurns:
    """The trajectories `rows` go on, each reading its observation next (left-padded to the longest). A row whose
    observation is empty reads its last read token again, in a new column (its old one masked), so that every
    row's last column is one it reads: generate() samples from the last column's distribution."""
    index = torch.tensor(rows, device=batch.input_ids.device)
    input_ids, attention_mask = batch.input_ids[index].clone(), batch.attention_mask[index].clone()
    batch.cache.batch_select_indices(index)
    segments = []
    for i, tokens in enumerate(observations):
        if not tokens:
            last = int(attention_mask[i].nonzero().max())
            tokens = [int(input_ids[i, last])]
            attention_mask[i, last] = 0
        segments.append(tokens)
    new_ids, new_mask = _left_padded(segments, pad)
    device = input_ids.device
    return CachedTurns(
        torch.cat([input_ids, new_ids.to(device)], dim=1),
        torch.cat([attention_mask, new_mask.to(device)], dim=1),
        batch.cache,
    )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("rollout.cache_turns",),
        lambda cfg: cfg.rollout.tool_calling is not ToolCalling.native,
        "by grpo_exp's multi-turn loop",
        lambda cfg: "rollout.tool_calling=native plays the turns in TRL's own loop",
        "drop rollout.tool_calling=native",
    ),
)
