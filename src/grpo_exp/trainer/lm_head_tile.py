"""The token tile of TRL's fused LM head (trainer.lm_head_tile_tokens): TRL computes the loss's log-probabilities
[tile tokens x 32,768 vocabulary entries] at a time, in its forward and again in its backward, never the whole logits.
Its tile of 4,096 tokens holds 512 MB of float32 logits, and the backward several such buffers at once; a smaller tile
gives the same log-probabilities (each token's sum over the vocabulary is unchanged) for a lower peak. TRL reads its
module's TOKEN_CHUNK_SIZE at each call, forward and backward alike (declared in grpo_exp.trainer.trl_contract)."""

import importlib

from grpo_exp.trainer.trl_contract import TRL_LM_HEAD_TILE


def set_lm_head_tile(tokens: int) -> None:
    """Every fused LM head of this process (the policy's, the reference model's) takes tiles of `tokens` tokens."""
    module, name = TRL_LM_HEAD_TILE
    setattr(importlib.import_module(module), name, tokens)
