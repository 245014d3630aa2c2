"""Reading a rubric's scores from a local model's probabilities (the `scores` mode of the local judge).

Each prompt is a chat-templated judge request ending where the reply starts; the reply is opened at each
criterion's score (`{"accuracy": `) and the judge's distribution over the rubric's score tokens ("1".."5") there
gives an expected score. Prompts that judge answers to the same question share their opening, which is read once.

torch is imported where a model is read, not with the module: every module of grpo_exp.rewards is imported to find
the components (grpo_exp.rewards.components), also where they are only named (--help, --cfg)."""

from typing import TYPE_CHECKING

from grpo_exp.errors import UserError
from grpo_exp.rewards.rubric import QUALITY, Rubric, expected_score, score_position

if TYPE_CHECKING:
    import torch


def score_token_ids(tokenizer, prefix: str, rubric: Rubric = QUALITY) -> list[int]:
    """The token of each of the rubric's scores ("1".."5") where the reply is opened at a score: it must extend the
    prefix by exactly one token."""
    base = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = []
    for token in rubric.score_tokens:
        extended = tokenizer(prefix + token, add_special_tokens=False)["input_ids"]
        if extended[: len(base)] != base or len(extended) != len(base) + 1:
            raise UserError(f"judge.mode=scores: the judge's tokenizer does not write score {token} as one token")
        ids.append(extended[-1])
    return ids


def score_tokens_locally(
    model, tokenizer, prompts: list[str], batch_size: int, groups: list[str] | None = None, rubric: Rubric = QUALITY
) -> list[list[float]]:
    """Each criterion's expected score for chat-templated judge prompts (ending where the reply starts).

    Prompts with the same `groups` key (the question a group of completions answers) share their opening: the
    rubric's instructions and the question. That opening is read once per group; then one pass reads each prompt's
    own rest and, as branches after it, the reply opened at every criterion's score."""
    import torch

    from grpo_exp.generation import left_padded_eval

    digits = score_token_ids(tokenizer, prompts[0] + score_position(rubric.criteria[0]), rubric)
    groups = groups or list(range(len(prompts)))
    scores: list[list[float]] = []
    with left_padded_eval(model, tokenizer), torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = slice(start, start + batch_size)
            scores += _score_batch(model, tokenizer, prompts[chunk], groups[chunk], digits, rubric)
    return scores


def _score_batch(
    model, tokenizer, prompts: list[str], groups: list, digits: list[int], rubric: Rubric
) -> list[list[float]]:
    import torch

    from grpo_exp.masks import MASKABLE_ATTENTION

    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    branches = [
        tokenizer([p + score_position(c) for c in rubric.criteria], add_special_tokens=False)["input_ids"]
        for p in prompts
    ]
    if not all(b[: len(p)] == p for p, row in zip(prompt_ids, branches, strict=True) for b in row) or (
        model.config._attn_implementation not in MASKABLE_ATTENTION
    ):  # a tokenizer that merges across the prompt's end, or no custom masks: read every branch whole
        batch = tokenizer.pad({"input_ids": [b for row in branches for b in row]}, return_tensors="pt")
        last = _forward(model, batch.to(model.device))[0]
    else:
        keys = list(dict.fromkeys(groups))
        group_of = [keys.index(g) for g in groups]
        openings = [
            _common_prefix([p for p, k in zip(prompt_ids, group_of, strict=True) if k == key])
            for key in range(len(keys))
        ]
        cache, mask = _forward(model, tokenizer.pad({"input_ids": openings}, return_tensors="pt").to(model.device))[1:]
        rows = torch.tensor(group_of, device=model.device)
        cache.batch_select_indices(rows)
        rests = [p[len(openings[k]) :] for p, k in zip(prompt_ids, group_of, strict=True)]
        tails = [[b[len(p) :] for b in row] for p, row in zip(prompt_ids, branches, strict=True)]
        last = _read_branches(model, cache, mask[rows], rests, tails, tokenizer.pad_token_id)
    probabilities = torch.softmax(last[:, digits].float(), dim=-1).tolist()
    expected = [expected_score(p, rubric) for p in probabilities]
    count = len(rubric.criteria)
    return [expected[i : i + count] for i in range(0, len(expected), count)]


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    """The longest opening all sequences share, less one token: each keeps a token of its own to read."""
    shortest = min(len(s) for s in sequences)
    length = next((i for i in range(shortest) if len({s[i] for s in sequences}) > 1), shortest)
    return sequences[0][: min(length, shortest - 1)]


def _forward(model, batch):
    """Left-padded sequences read from scratch: the last position's logits, the cache and its attention mask."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # left padding: real tokens count from 0
    out = model(
        input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    return out.logits[:, -1, :], out.past_key_values, mask


def _read_branches(model, cache, cached_mask, rests, tails, pad: int) -> "torch.Tensor":
    """Each row's cached opening continued by its rest, then by each of its branches (the criteria's openings of
    the reply), all in one pass: a branch sees the cache, its row's rest and itself, never another branch, so the
    cache is not copied per branch. The logits at each branch's end, row-major.

    Columns: the rests left-padded to one width, then branch k of every row right-padded to branch k's width."""
    import torch

    from grpo_exp.masks import additive_mask, branch_attention

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
    sees_cache = cached_mask.bool().cpu()[:, None, :].expand(rows, segment.shape[1], -1)
    allowed = torch.cat([sees_cache, branch_attention(segment)], dim=2)[:, None]  # (rows, 1, new, cached + new)
    additive = additive_mask(allowed, model.dtype)
    keep = sorted({column for _, column in ends})  # the vocabulary projection only where a branch ends
    out = model(
        input_ids=ids.to(model.device),
        attention_mask=additive.to(model.device),
        position_ids=positions.to(model.device),
        past_key_values=cache,
        logits_to_keep=torch.tensor(keep, device=model.device),
    )
    return torch.stack([out.logits[i, keep.index(column)] for i, column in ends])
