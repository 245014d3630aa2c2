"""Sampling from a copy of the policy, with the copy's own log-probability of every sampled token.

Two reasons to sample from a copy rather than from the policy TRL trains (trainer.bfloat16_generation,
trainer.fast_generation):

- bfloat16 weights, below;
- decoding faster on CPU in the policy's own dtype (`prepack`): the copy's Linear weights laid out once per step for
  a packed matmul (a decode step multiplies a few rows by every weight), MKL's sgemm in float32 and oneDNN's in
  bfloat16 (PrepackedLinear), and each prompt's prefill computed once for its G completions, its KV cache repeated
  G times. In float32 that is the policy's own distribution (up to the float rounding of another summation order),
  so nothing needs correcting.

Decoding on a CPU reads every weight once per token-step, so a bfloat16 copy (half the bytes) decodes 8 sequences
in ~0.57x the time of the float32 policy (BENCHMARKS.md, decode speed). Its samples come from slightly different
weights than the ones trained; the seam (grpo_exp.trainer.seam) hands TRL the copy's log-probabilities as the
behaviour policy's, so the loss's ratio exp(log p_policy - log p_copy) is the importance weight of each token
against the distribution that really sampled it, clipped by TRL's epsilon as PPO clips any behaviour policy.
That correction needs no extra forward pass.

oneDNN prepacks bfloat16 weights only on CPUs with AVX-512 BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only CPU, such as
many AMD EPYCs, has neither): `prepack_unsupported` says so before anything is laid out, and there the trainer's
Sampler (grpo_exp.trainer.sampling) falls back to an unpacked copy (auto fast_generation) or refuses (an explicit one).
"""

import contextlib
import copy
import functools
import os

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from grpo_exp.freed_memory import return_freed_memory
from grpo_exp.generation import cache_argument, distinct_rows, read_positions
from grpo_exp.sampled_log_probs import SampledLogProbs

MKL_PACK_ENV = "GRPO_EXP_MKL_PACK"


def mkl_packs(dtype: torch.dtype) -> bool:
    """Whether a PrepackedLinear of `dtype` multiplies by MKL's packed sgemm: float32, where torch has MKL (x86-64
    builds), unless GRPO_EXP_MKL_PACK=0 (or false/off/no) in the environment. MKL's packed layout gains with AVX2
    kernels too, where oneDNN's prepacked float32 gains nothing over TRL's generate() (BENCHMARKS.md, decode).
    Otherwise, and for bfloat16, oneDNN's kernels."""
    turned_off = os.environ.get(MKL_PACK_ENV, "").strip().lower() in ("0", "false", "off", "no")
    return dtype == torch.float32 and torch.backends.mkl.is_available() and not turned_off


class PrepackedLinear(torch.nn.Module):
    """A Linear layer (CPU) whose weight is held laid out for its kernel, laid out again by `load`.

    float32 with MKL (`mkl_packs`): the weight given to `load` (the policy's own tensor, not a copy) is packed for
    MKL's sgemm at the first decode step after `load` (a row's one new token: few rows times every weight, where the
    layout pays) and again when their number of rows changes (another batch size), since MKL packs for one number of
    rows. Other inputs, a prefill's many rows, multiply the weight as torch.nn.Linear does. Otherwise: oneDNN's
    prepacked matmul, laid out at `load`."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.bias = linear.bias
        self.dtype = linear.weight.dtype
        self.mkl = mkl_packs(self.dtype)
        self.load(linear.weight)

    @torch.no_grad()
    def load(self, weight: torch.Tensor) -> None:
        self.release()  # the old layout freed before the new one is made: one copy of the weight at a time
        weight = weight.detach().to(self.dtype)
        if self.mkl:
            self.unpacked = weight
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)

    def release(self) -> None:
        self.packed, self.packed_rows, self.unpacked = None, None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.mkl:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if x.dim() != 3 or x.shape[1] != 1:  # not a decode step
            return torch.nn.functional.linear(x, self.unpacked, self.bias)
        rows = x.shape[0]
        if rows != self.packed_rows:
            self.packed = None  # the old layout freed first
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.unpacked, rows)
            self.packed_rows = rows
        return torch.ops.mkl._mkl_linear(x, self.packed, self.unpacked, self.bias, rows)


ONEDNN_BF16_ENV = "GRPO_EXP_ONEDNN_BF16"
ONEDNN_BF16_NEEDS = "AVX-512 BW/VL/DQ or AVX-NE-CONVERT"


def prepack_unsupported(dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot prepack Linear weights of `dtype` on this CPU; None when it can.

    oneDNN's prepacked matmul is a CPU kernel of torch builds with mkldnn; in bfloat16 it also needs AVX-512 BW/VL/DQ
    or AVX-NE-CONVERT. Detected by prepacking and running a 2x2 Linear once per dtype (`_probe_failure`).
    GRPO_EXP_ONEDNN_BF16=0 (or false/off/no) in the environment reports bfloat16 unsupported whatever the CPU: the
    fallback of a CPU without those features, for tests and for CPUs whose bfloat16 kernels misbehave. Read on every
    call, so that setting it takes effect at once. (ONEDNN_MAX_CPU_ISA=AVX2, oneDNN's own cap, read when a process
    starts, reproduces an AVX2-only CPU: the probe then fails as it does there.)"""
    if not mkl_packs(dtype) and not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)" + (" and no MKL" if dtype == torch.float32 else "")
    if dtype == torch.bfloat16 and os.environ.get(ONEDNN_BF16_ENV, "").strip().lower() in ("0", "false", "off", "no"):
        return f"{_cannot(dtype)}: {ONEDNN_BF16_ENV}={os.environ[ONEDNN_BF16_ENV]} turns bfloat16 prepacking off"
    return _probe_failure(dtype, mkl_packs(dtype))


@functools.cache
def _probe_failure(dtype: torch.dtype, mkl: bool) -> str | None:
    """A 2x2 Linear prepacked (for MKL where `mkl`, as mkl_packs says) and run once: the kernels' own check of the
    CPU, and its message. (For bfloat16, torch.ops.mkldnn._is_mkldnn_bf16_supported() asks the same question, but
    says nothing of the kernels we call.)"""
    try:
        with torch.no_grad():
            # skip_init: a random initialisation would draw from torch's global generator, and so change what a
            # seeded run samples after the probe.
            linear = torch.nn.utils.skip_init(torch.nn.Linear, 2, 2, dtype=dtype)
            linear.weight.zero_()
            linear.bias.zero_()
            PrepackedLinear(linear)(torch.ones(1, 1, 2, dtype=dtype))  # a decode step's shape: MKL's packed path
    except RuntimeError as err:  # TORCH_CHECK's error, e.g. "bf16 path needs the cpu support avx_ne_convert or ..."
        return f"{_cannot(dtype)}: {err}"
    return None


def _cannot(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    needs = f" (needs {ONEDNN_BF16_NEEDS})" if dtype == torch.bfloat16 else ""
    return f"this CPU cannot prepack {name} weights for {'MKL' if mkl_packs(dtype) else 'oneDNN'}{needs}"


def can_prepack() -> bool:
    """Whether float32 weights prepack here (MKL or oneDNN) (the policy's own dtype in most runs)."""
    return prepack_unsupported(torch.float32) is None


@torch.no_grad()
def prepack_linears(model: torch.nn.Module, probe: list[int] | None) -> dict[str, PrepackedLinear]:
    """Every torch.nn.Linear of `model` replaced by a PrepackedLinear, by module name. With `probe` (token ids), the
    model must give the same logits before and after, to a few roundings of its dtype (ValueError if not; a model
    whose forward reads a Linear's `.weight`, such as peft's LoRA layers, raises on the way)."""
    ids = None if probe is None else torch.tensor([probe], device=model.device)
    expected = None if ids is None else _probe_logits(model, ids)
    prepacked = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:  # exactly: quantised subclasses keep their own kernels
                packed = prepacked[f"{name}.{child_name}" if name else child_name] = PrepackedLinear(child)
                setattr(module, child_name, packed)
    if expected is not None:
        gap = float((_probe_logits(model, ids) - expected).abs().max())
        tolerance = max(1e-3, 4 * torch.finfo(expected.dtype).eps) * max(1.0, float(expected.abs().max()))
        if not gap <= tolerance:
            raise ValueError(f"the prepacked copy's logits differ from the model's by {gap:.3g}")
    return prepacked


def _probe_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The logits of `ids` as one sequence (a prefill) and as a batch of one-token sequences (a decode step's shape):
    both kernels of an MKL-packed layer."""
    return torch.cat([model(input_ids=batch).logits.flatten(0, 1) for batch in (ids, ids.T)])


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
