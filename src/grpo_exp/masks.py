"""Attention masks for branches: several continuations of one shared opening, read in one pass.

A row's positions are labelled by segment: 0 the shared part, k >= 1 branch k, -1 padding. A position sees,
causally, the shared part and its own branch, never another branch; a padding position sees only itself (a row
with nothing to attend to would give NaN). Used by the local judge's score reader and the shared-prompt loss."""

import torch

# Attention implementations that take a custom 4D mask (flash attention does not).
MASKABLE_ATTENTION = ("sdpa", "eager")


def branch_attention(segment: torch.Tensor) -> torch.Tensor:
    """segment [rows, L] -> [rows, L, L] bool: which positions each position attends to."""
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    shared_or_same = (segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])
    return causal & shared_or_same & (segment[:, None, :] >= 0) | torch.eye(width, dtype=torch.bool)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive one eager attention takes: 0 where allowed, the dtype's minimum elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
