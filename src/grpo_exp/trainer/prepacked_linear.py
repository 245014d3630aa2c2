"""Linear layers whose weights are laid out once for a packed matmul on CPU, and what this CPU and torch build can
pack: the sampling copy's kernels (grpo_exp.trainer.sampling_copy).

A decode step multiplies a few rows by every weight; a layout made once per refresh saves re-arranging the weight at
every call. float32 goes to MKL's packed sgemm where torch has MKL, bfloat16 (and float32 without MKL) to oneDNN's
prepacked matmul (`PrepackedLinear`). `prepack_linears` swaps a model's Linear layers for them and checks its logits.

oneDNN prepacks bfloat16 weights only on CPUs with AVX-512 BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only CPU, such as
many AMD EPYCs, has neither): `prepack_unsupported` says so before anything is laid out, and there the trainer's
Sampler (grpo_exp.trainer.sampling) falls back to an unpacked copy (auto fast_generation) or refuses (an explicit one).
"""

import functools
import os

import torch

MKL_PACK_ENV = "GRPO_EXP_MKL_PACK"


def _turned_off(variable: str) -> bool:
    """Whether the environment sets `variable` to 0, false, off or no (read on every call: it acts at once)."""
    return os.environ.get(variable, "").strip().lower() in ("0", "false", "off", "no")


def mkl_packs(dtype: torch.dtype) -> bool:
    """Whether a PrepackedLinear of `dtype` multiplies by MKL's packed sgemm: float32, where torch has MKL (x86-64
    builds), unless GRPO_EXP_MKL_PACK=0 (or false/off/no) in the environment. MKL's packed layout gains with AVX2
    kernels too, where oneDNN's prepacked float32 gains nothing over TRL's generate() (BENCHMARKS.md, decode).
    Otherwise, and for bfloat16, oneDNN's kernels."""
    return dtype == torch.float32 and torch.backends.mkl.is_available() and not _turned_off(MKL_PACK_ENV)


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
    """Why Linear weights of `dtype` cannot be prepacked on this CPU (MKL's kernel or oneDNN's: mkl_packs); None when
    they can.

    oneDNN's prepacked matmul is a CPU kernel of torch builds with mkldnn; in bfloat16 it also needs AVX-512 BW/VL/DQ
    or AVX-NE-CONVERT. Detected by prepacking and running a 2x2 Linear once per dtype (`_probe_failure`).
    GRPO_EXP_ONEDNN_BF16=0 (or false/off/no) in the environment reports bfloat16 unsupported whatever the CPU: the
    fallback of a CPU without those features, for tests and for CPUs whose bfloat16 kernels misbehave. Read on every
    call, so that setting it takes effect at once. (ONEDNN_MAX_CPU_ISA=AVX2, oneDNN's own cap, read when a process
    starts, reproduces an AVX2-only CPU: the probe then fails as it does there.)"""
    if not mkl_packs(dtype) and not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)" + (" and no MKL" if dtype == torch.float32 else "")
    if dtype == torch.bfloat16 and _turned_off(ONEDNN_BF16_ENV):
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


# The probe's first tokens only: what it catches (a forward that reads a Linear's weight, a kernel that miscomputes)
# shows on a few rows, and each of its four forwards reads every weight: the embedded model's probe took 3.1 s on a
# 45-token prompt, 1.5 s on 8, the packed layers' first call included (AVX2-only EPYC, one thread).
PROBE_TOKENS = 8


@torch.no_grad()
def prepack_linears(model: torch.nn.Module, probe: list[int] | None) -> dict[str, PrepackedLinear]:
    """Every torch.nn.Linear of `model` replaced by a PrepackedLinear, by module name. With `probe` (token ids; its
    first PROBE_TOKENS), the model must give the same logits before and after, to a few roundings of its dtype
    (ValueError if not; a model whose forward reads a Linear's `.weight`, such as peft's LoRA layers, raises on the
    way)."""
    ids = None if probe is None else torch.tensor([probe[:PROBE_TOKENS]], device=model.device)
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
