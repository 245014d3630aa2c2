"""Each target token's log-probability under a model, with the LM head computed a chunk of positions at a time: the
peak grows with the chunk, not with batch x length x vocabulary (a 1,024-token completion over a 151,936-token
vocabulary is 1.2 GB of float64 logits a row). What grpo_exp scores itself (the float64 reference) goes through
here; the loss's log-probabilities are TRL's (its fused LM head, tiled the same way)."""

import torch

CHUNK_TOKENS = 256  # positions whose logits are held at once: 256 x 151,936 x 8 bytes = 0.3 GB in float64


def scales_logits(config) -> bool:
    """Whether the model transforms its LM head's output (a soft cap, a scale): then only its own forward is exact."""
    text = config.get_text_config()
    return any(getattr(text, key, None) for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


@torch.no_grad()
def token_log_probs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """[B, T]: log_softmax(logits / temperature) at each of `targets` ([B, T], the last T tokens of `input_ids`),
    computed in the LM head's dtype; the head over `chunk_tokens` positions at a time."""
    width = targets.shape[1]
    if scales_logits(model.config):  # the model's own forward, one row at a time
        rows = [
            token_log_probs_of_logits(model(input_ids=ids[None], attention_mask=mask[None]).logits, row[None], width)
            for ids, mask, row in zip(input_ids, attention_mask, targets, strict=True)
        ]
        return torch.cat(rows) if rows else targets.new_zeros(targets.shape, dtype=torch.float64)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    hidden = hidden[:, -width - 1 : -1].reshape(-1, hidden.shape[-1])
    head, flat_targets = model.get_output_embeddings(), targets.reshape(-1)
    pieces = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        logits = head(hidden[start : start + chunk_tokens]) / temperature
        pieces.append(logits.log_softmax(-1).gather(1, flat_targets[start : start + chunk_tokens, None]).squeeze(1))
    return torch.cat(pieces).view(targets.shape)


def token_log_probs_of_logits(logits: torch.Tensor, targets: torch.Tensor, width: int) -> torch.Tensor:
    return torch.log_softmax(logits[:, -width - 1 : -1], dim=-1).gather(2, targets[..., None]).squeeze(2)
