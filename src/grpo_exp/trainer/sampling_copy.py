"""Sampling from a copy of the policy, with the copy's own log-probability of every sampled token.

Two reasons to sample from a copy rather than from the policy TRL trains (trainer.bfloat16_generation,
trainer.fast_generation):

- bfloat16 weights, below;
- decoding faster on CPU in the policy's own dtype (`prepack`): the copy's Linear weights laid out once per step for
  a packed matmul (a decode step multiplies a few rows by every weight), MKL's sgemm in float32 and oneDNN's in
  bfloat16 (grpo_exp.trainer.prepacked_linear), and each prompt's prefill computed once for its G completions, its
  KV cache repeated G times. In float32 that is the policy's own distribution (up to the float rounding of another
  summation order), so nothing needs correcting.

Decoding on a CPU reads every weight once per token-step, so a bfloat16 copy (half the bytes) decodes 8 sequences
in ~0.57x the time of the float32 policy (BENCHMARKS.md, decode speed). Its samples come from slightly different
weights than the ones trained; the seam (grpo_exp.trainer.seam) hands TRL the copy's log-probabilities as the
behaviour policy's, so the loss's ratio exp(log p_policy - log p_copy) is the importance weight of each token
against the distribution that really sampled it, clipped by TRL's epsilon as PPO clips any behaviour policy.
That correction needs no extra forward pass.
"""

import contextlib
import copy

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from grpo_exp.freed_memory import return_freed_memory
from grpo_exp.generation import cache_argument, distinct_rows, read_positions
from grpo_exp.sampled_log_probs import SampledLogProbs
from grpo_exp.trainer.prepacked_linear import prepack_linears, prepack_unsupported


class SamplingCopy:
    """A copy of `policy` with its parameters in `dtype` (its buffers, such as rotary frequencies, stay as they are),
    refreshed from the policy whenever the training step has changed since the last refresh. `release` frees its
    weights between uses (the next `sync` makes them again): a copy costs memory only while it samples, when the
    policy holds no gradients and no activations, so it does not raise the peak of a step. With `prepack` (CPU),
    its Linear layers are PrepackedLinear (checked on `probe`: prepack_linears) and each prompt's prefill is shared
    by its repeats; RuntimeError, with the reason, where this CPU cannot prepack `dtype` (prepack_unsupported)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        dtype: torch.dtype = torch.bfloat16,
        prepack: bool = False,
        probe: list[int] | None = None,
    ):
        unsupported = prepack_unsupported(dtype) if prepack else None
        if unsupported is not None:  # before the kernels raise it, on a copy of the whole model
            raise RuntimeError(unsupported)
        self.copy = copy.deepcopy(policy).eval().requires_grad_(False)
        for module in self.copy.modules():
            # A forward patched onto the instance (TRL's fused LM head) still calls the policy's own forward: the
            # copy would generate with the float32 policy. The class's forward is the one generate() needs.
            module.__dict__.pop("forward", None)
        for parameter in self.copy.parameters():
            parameter.data = parameter.data.to(dtype)
        self.prepacked = prepack_linears(self.copy, probe) if prepack else {}
        self.prepack = prepack
        self.synced_step: int | None = None

    @torch.no_grad()
    def sync(self, policy: torch.nn.Module, step: int | None) -> None:
        """The policy's weights, unless already synced at this training step (step None: always)."""
        if step is not None and step == self.synced_step:
            return
        sources = dict(policy.named_parameters())
        for name, target in self.copy.named_parameters():
            if target.shape != sources[name].shape:  # released
                target.data = torch.empty(sources[name].shape, dtype=target.dtype, device=target.device)
            target.copy_(sources[name])  # cast to the copy's dtype on the way
        modules = dict(policy.named_modules())
        for name, packed in self.prepacked.items():
            packed.load(modules[name].weight)
        self.synced_step = step

    def release(self) -> None:
        """Frees the copy's weights (its parameters and prepacked layouts) until the next `sync`."""
        for parameter in self.copy.parameters():
            parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)
        for packed in self.prepacked.values():
            packed.release()
        self.synced_step = None
        return_freed_memory()

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], generation_config, with_log_probs: bool = True
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Each prompt's completion (through its first EOS, as TRL cuts it) and, `with_log_probs`, the sampler's
        log-probability of each of its tokens as TRL's loss computes the policy's: the copy's whole distribution at
        the sampling temperature, not the one top-k / top-p truncated and renormalised
        (grpo_exp.sampled_log_probs).
        `generation_config` (TRL's) replaces the copy's own, so that none of the model's defaults slip in."""
        self.copy.generation_config = generation_config
        pad, eos = generation_config.pad_token_id, generation_config.eos_token_id
        prompts = [torch.tensor(ids) for ids in prompt_ids]
        input_ids = pad_sequence(prompts, batch_first=True, padding_value=pad, padding_side="left")
        attention_mask = pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True, padding_side="left")
        input_ids, attention_mask = input_ids.to(self.copy.device), attention_mask.to(self.copy.device)
        cache = None
        if self.prepack and generation_config.cache_implementation is None:
            cache = shared_prefill(self.copy, input_ids, attention_mask)
        temperature = generation_config.temperature if generation_config.do_sample else 1.0
        record = SampledLogProbs(self.copy, temperature) if with_log_probs else None
        with record or contextlib.nullcontext():
            cached = {cache_argument(self.copy): cache}
            sequences = self.copy.generate(input_ids=input_ids, attention_mask=attention_mask, **cached)
        completions = sequences[:, input_ids.shape[1] :].cpu()
        lengths = through_first_eos(completions, eos if isinstance(eos, list) else [eos])
        log_probs = None if record is None else record.of(completions)
        return (
            [row[:n].tolist() for row, n in zip(completions, lengths, strict=True)],
            None if log_probs is None else [row[:n].tolist() for row, n in zip(log_probs, lengths, strict=True)],
        )


def shared_prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> DynamicCache | None:
    """The KV cache of every row's prompt but its last token, computed once per distinct prompt and repeated for
    the rows that share it (TRL repeats each prompt G times); generate() then starts from the last token. None
    when no prompt repeats (nothing to share)."""
    first, row_of = distinct_rows(torch.cat([input_ids, attention_mask], dim=1))  # a row of each prompt
    if len(first) == len(input_ids) or input_ids.shape[1] < 2:
        return None
    ids, mask = input_ids[first, :-1], attention_mask[first, :-1]
    positions = read_positions(mask)  # generate()'s own, counted from each row's first real token
    cache = DynamicCache(config=model.config)
    model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        **{cache_argument(model): cache},
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_select_indices(row_of.to(input_ids.device))
    return cache


def through_first_eos(tokens: torch.Tensor, eos_token_ids: list[int]) -> list[int]:
    """Each row's length up to and including its first EOS token (the whole row if it has none)."""
    is_eos = torch.isin(tokens, torch.tensor(eos_token_ids))
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, tokens.shape[1])
    return first.tolist()
