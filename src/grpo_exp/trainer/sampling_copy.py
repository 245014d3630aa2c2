"""Sampling from a copy of the policy, with the copy's own log-probability of every sampled token.

Decoding on a CPU reads every weight once per token-step, so a bfloat16 copy (half the bytes) decodes 8 sequences
in ~0.57x the time of the float32 policy (BENCHMARKS.md, decode speed). Its samples come from slightly different
weights than the ones trained; the seam (grpo_exp.trainer.seam) hands TRL the copy's log-probabilities as the
behaviour policy's, so the loss's ratio exp(log p_policy - log p_copy) is the importance weight of each token
against the distribution that really sampled it, clipped by TRL's epsilon as PPO clips any behaviour policy.
That correction needs no extra forward pass.
"""

import copy

import torch
from torch.nn.utils.rnn import pad_sequence


class SamplingCopy:
    """A copy of `policy` with its parameters in `dtype` (its buffers, such as rotary frequencies, stay as they are),
    refreshed from the policy whenever the training step has changed since the last refresh."""

    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.copy = copy.deepcopy(policy).eval().requires_grad_(False)
        for module in self.copy.modules():
            # A forward patched onto the instance (TRL's fused LM head) still calls the policy's own forward: the
            # copy would generate with the float32 policy. The class's forward is the one generate() needs.
            module.__dict__.pop("forward", None)
        for parameter in self.copy.parameters():
            parameter.data = parameter.data.to(dtype)
        self.synced_step: int | None = None

    @torch.no_grad()
    def sync(self, policy: torch.nn.Module, step: int) -> None:
        if step == self.synced_step:
            return
        for target, source in zip(self.copy.parameters(), policy.parameters(), strict=True):
            target.copy_(source)  # cast to the copy's dtype on the way
        self.synced_step = step

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], generation_config) -> tuple[list[list[int]], list[list[float]]]:
        """Each prompt's completion (through its first EOS, as TRL cuts it) and the sampler's log-probability of
        each of its tokens, under the distribution it was drawn from (temperature, top-k, top-p... applied).
        `generation_config` (TRL's) replaces the copy's own, so that none of the model's defaults slip in."""
        self.copy.generation_config = generation_config
        pad, eos = generation_config.pad_token_id, generation_config.eos_token_id
        prompts = [torch.tensor(ids) for ids in prompt_ids]
        input_ids = pad_sequence(prompts, batch_first=True, padding_value=pad, padding_side="left")
        attention_mask = pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True, padding_side="left")
        output = self.copy.generate(
            input_ids=input_ids.to(self.copy.device), attention_mask=attention_mask.to(self.copy.device),
            output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        completions = output.sequences[:, input_ids.shape[1] :].cpu()
        log_probs = sampled_log_probs(output.scores, completions)
        lengths = through_first_eos(completions, eos if isinstance(eos, list) else [eos])
        return (
            [row[:n].tolist() for row, n in zip(completions, lengths, strict=True)],
            [row[:n].tolist() for row, n in zip(log_probs, lengths, strict=True)],
        )


def sampled_log_probs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """[B, T] log-probability of each sampled token under the distribution it was sampled from: `scores` are
    generate()'s processed scores of each step ([B, V] each: logits after temperature, top-k/top-p masking...)."""
    columns = [
        torch.log_softmax(step.float(), dim=-1).gather(1, tokens[:, t : t + 1].to(step.device)).cpu()
        for t, step in enumerate(scores)
    ]
    return torch.cat(columns, dim=1)


def through_first_eos(tokens: torch.Tensor, eos_token_ids: list[int]) -> list[int]:
    """Each row's length up to and including its first EOS token (the whole row if it has none)."""
    is_eos = torch.isin(tokens, torch.tensor(eos_token_ids))
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, tokens.shape[1])
    return first.tolist()
