"""The loss forward with each prompt read once: a group's G completions as branches of one packed sequence.

TRL's batch holds every completion with its own copy of the prompt (left-padded) and the completion right-padded
to the longest one. Packed, a group becomes [prompt without its last token | last prompt token, completion 1 |
last prompt token, completion 2 | ...]: a branch sees the shared prompt and itself, never another branch, and its
positions continue the prompt's. Every completion token then has the same context as in TRL's layout, so the
log-probabilities (and their gradients) are TRL's up to float rounding, for fewer tokens: on the default run a
group of 4 is ~100 prompt tokens + 4 x ~60 instead of 4 x ~160, and no padding.

Each branch starts with its own copy of the last prompt token so that a position has one next token to predict:
labels are given pre-shifted (TRL's fused LM head takes `shift_labels`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_exp.masks import MASKABLE_ATTENTION, additive_mask, branch_attention

IGNORE = -100  # a position with no next token to score
# Longest packed group worth packing: its attention is computed over the whole pack and masked, so many long
# branches (large G, long completions) would cost more than the prompt copies saved.
MAX_PACKED_TOKENS = 2048


@dataclass
class PackedGroups:
    input_ids: torch.Tensor  # [packs, L]
    position_ids: torch.Tensor  # [packs, L]
    allowed: torch.Tensor  # [packs, 1, L, L] bool: which positions each position attends to
    shift_labels: torch.Tensor  # [packs, L]: the token each position predicts (IGNORE: none)
    # where each row's completion token j is predicted: (pack, column of the position that predicts it)
    sources: list[tuple[int, torch.Tensor]]


def windowed(config) -> bool:
    """Whether the model's attention has a sliding window (a custom mask replaces the window, so long sequences would
    see further back than they should)."""
    text = config.get_text_config()
    return getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True)


def packable(config) -> bool:
    """Whether the model reads a packed group as TRL's rows: an attention that takes a custom mask, and no sliding
    window."""
    return config._attn_implementation in MASKABLE_ATTENTION and not windowed(config)


def pack_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_width: int,
    pad_id: int,
    max_tokens: int = MAX_PACKED_TOKENS,
) -> PackedGroups | None:
    """TRL's rows (prompt left-padded, completion right-padded to `completion_width`) packed by identical prompt;
    None when a pack would be longer than max_tokens."""
    prompt_width = input_ids.shape[1] - completion_width
    prompts, completions = [], []
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        prompts.append(tuple(t for t, m in zip(ids[:prompt_width], mask[:prompt_width], strict=True) if m))
        completions.append([t for t, m in zip(ids[prompt_width:], mask[prompt_width:], strict=True) if m])
    groups: dict[tuple, list[int]] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(row)
    sequences, sources = [], [None] * len(prompts)
    for pack, (prompt, rows) in enumerate(groups.items()):
        shared = len(prompt) - 1
        ids, positions, segments, labels = list(prompt[:-1]), list(range(shared)), [0] * shared, [IGNORE] * shared
        for branch, row in enumerate(rows, start=1):
            completion, start = completions[row], len(ids)
            ids += [prompt[-1], *completion]
            positions += range(shared, shared + len(completion) + 1)
            segments += [branch] * (len(completion) + 1)
            labels += [*completion, IGNORE]
            sources[row] = (pack, torch.arange(start, start + len(completion)))
        sequences.append((ids, positions, segments, labels))
    width = max(len(s[0]) for s in sequences)
    if width > max_tokens:
        return None
    packs = len(sequences)
    input_ids_out = torch.full((packs, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((packs, width), dtype=torch.long)
    segment = torch.full((packs, width), -1)  # -1: padding
    shift_labels = torch.full((packs, width), IGNORE, dtype=torch.long)
    for pack, (ids, positions, segments, labels) in enumerate(sequences):
        n = len(ids)
        input_ids_out[pack, :n] = torch.tensor(ids)
        position_ids[pack, :n] = torch.tensor(positions)
        segment[pack, :n] = torch.tensor(segments)
        shift_labels[pack, :n] = torch.tensor(labels)
    return PackedGroups(input_ids_out, position_ids, branch_attention(segment)[:, None], shift_labels, sources)


def unpack(values: torch.Tensor, packed: PackedGroups, completion_width: int) -> torch.Tensor:
    """Per-position values of the packed forward [packs, L] -> TRL's per-token layout [B, completion_width] (0 at
    padding), differentiably."""
    rows = []
    for pack, columns in packed.sources:
        row = values[pack, columns.to(values.device)]
        rows.append(torch.nn.functional.pad(row, (0, completion_width - len(columns))))
    return torch.stack(rows)


def shared_prompt_forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_width: int,
    pad_id: int,
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """TRL's per-token log-probabilities (and entropies, where `forward` gives them) of the completions of TRL's
    rows, [B, completion_width], from one packed forward; None where the model or the batch cannot be packed.
    `model`: the unwrapped policy (its config and dtype); `forward(input_ids=, attention_mask=, position_ids=,
    shift_labels=) -> (log_probs, entropy)`: the policy's forward scoring each position's label, as the loss runs it."""
    if not packable(model.config):
        return None
    packed = pack_groups(input_ids.cpu(), attention_mask.cpu(), completion_width, pad_id)
    if packed is None:
        return None
    device = input_ids.device
    # sdpa takes a boolean mask whatever the compute dtype (autocast); eager adds a float one
    sdpa = model.config._attn_implementation == "sdpa"
    mask = packed.allowed if sdpa else additive_mask(packed.allowed, model.dtype)
    log_probs, entropy = forward(
        input_ids=packed.input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=packed.position_ids.to(device),
        shift_labels=packed.shift_labels.to(device),
    )
    entropies = None if entropy is None else unpack(entropy, packed, completion_width)
    return unpack(log_probs, packed, completion_width), entropies
