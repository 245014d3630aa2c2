"""What samples a training batch: TRL's generate() on the policy, or a copy of it (grpo_exp.trainer.sampling_copy) in
bfloat16 (trainer.bfloat16_generation) and/or with prepacked weights (trainer.fast_generation).

The rules on these two knobs are functions of plain values, so that a run checks them before any model loads
(grpo_exp.trainer.config.check_trainer) and GRPOExpConfig checks those it can; fast_generation's auto value is
decided by `fast_generation_pays`. `Sampler` is one trainer's choice at run time: the seam (grpo_exp.trainer.seam)
asks it which copy, if any, samples a batch.
"""

import contextlib
import logging
import platform

import torch
from accelerate.utils import parse_flag_from_env

from grpo_exp.errors import UserError
from grpo_exp.trainer.prepacked_linear import can_prepack, prepack_unsupported
from grpo_exp.trainer.sampling_copy import SamplingCopy

log = logging.getLogger(__name__)

# The generation= preset that sets each knob.
PRESETS = {"bfloat16_generation": "transformers_bf16", "fast_generation": "transformers_fast"}


def x86_64() -> bool:
    """The CPUs fast_generation was measured on (BENCHMARKS.md); elsewhere it is on only when asked for."""
    return platform.machine().lower() in ("x86_64", "amd64")


def runs_sharded(deepspeed=None, fsdp=None) -> bool:
    """Whether the policy's parameters are sharded over processes: DeepSpeed or FSDP, as `accelerate launch` says in
    the environment (ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP, which accelerate's own plugins read), or as
    TrainingArguments' `deepspeed` / `fsdp` fields say."""
    from_launch = parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") or parse_flag_from_env("ACCELERATE_USE_FSDP")
    return from_launch or bool(deepspeed) or bool(fsdp)


def training_device(use_cpu: bool) -> str:
    """The device type the policy trains on: TrainingArguments' use_cpu, else a CUDA GPU where there is one."""
    return "cpu" if use_cpu or not torch.cuda.is_available() else "cuda"


def check_sampling(
    bfloat16_generation: bool,
    fast_generation: bool | None,
    *,
    use_vllm: bool,
    use_transformers_paged: bool,
    multiturn: bool,
    device: str,
    sharded: bool,
    policy_dtype: torch.dtype,
) -> None:
    """Every rule on the sampling copy, before any model loads. With vLLM there is no copy: bfloat16_generation is
    the engine's dtype, which samples multi-turn rollouts' turns too, and takes the weights gathered."""
    check_generation_path(bfloat16_generation, fast_generation, use_vllm, use_transformers_paged)
    if use_vllm:
        return
    if multiturn:
        check_multiturn(bfloat16_generation, fast_generation)
    check_sharded_copy(bfloat16_generation, sharded, policy_dtype)
    check_fast_generation_device(fast_generation, device, sharded)


def _asked(bfloat16_generation: bool, fast_generation: bool | None) -> list[str]:
    """The sampling-copy knobs set to true, by name."""
    knobs = {"bfloat16_generation": bfloat16_generation, "fast_generation": fast_generation}
    return [name for name, value in knobs.items() if value]


def check_generation_path(
    bfloat16_generation: bool, fast_generation: bool | None, use_vllm: bool, use_transformers_paged: bool
) -> None:
    """bfloat16_generation and fast_generation replace TRL's transformers generate(); the other generation paths
    sample elsewhere (bfloat16_generation with vLLM: its engine runs in bfloat16)."""
    elsewhere = (
        ("use_vllm", use_vllm, "vLLM samples"),
        ("use_transformers_paged", use_transformers_paged, "continuous batching samples"),
    )
    for option in _asked(bfloat16_generation, fast_generation):
        for key, on, path in elsewhere:
            if on and not (option == "bfloat16_generation" and key == "use_vllm"):  # vLLM's engine in bfloat16
                raise UserError(
                    f"trainer.{option}=true is a transformers generation path (generation={PRESETS[option]}), "
                    f"but trainer.extra.{key}=true: {path} instead. Use one of them"
                )


def check_multiturn(bfloat16_generation: bool, fast_generation: bool | None) -> None:
    """A multi-turn rollout samples its turns from the policy or its prepacked float32 copy (fast_generation), whose
    log-probabilities are the policy's: no bfloat16 copy there (its samples would need correcting turn by turn)."""
    if bfloat16_generation:
        raise UserError(
            "rollout=multiturn generates its turns itself (trainer.bfloat16_generation is not used there); "
            "use generation=transformers or generation=transformers_fast"
        )


def check_sharded_copy(bfloat16_generation: bool, sharded: bool, policy_dtype: torch.dtype) -> None:
    """A copy of sharded parameters would hold this process's shards only (a bfloat16 policy needs no copy)."""
    if bfloat16_generation and sharded and policy_dtype != torch.bfloat16:
        raise UserError(
            "trainer.bfloat16_generation copies a float32 policy whole: not under DeepSpeed or FSDP; use "
            "model.dtype=bfloat16, generation=transformers or generation=vllm_colocate there"
        )


def check_fast_generation_device(fast_generation: bool | None, device: str, sharded: bool) -> None:
    """An explicit fast_generation decodes from a prepacked copy of the whole policy, on CPU with MKL or oneDNN."""
    unsupported = prepack_unsupported(torch.float32)  # e.g. "this torch build has no oneDNN (mkldnn) and no MKL"
    if fast_generation and (device != "cpu" or sharded or unsupported):
        raise UserError(
            f"trainer.fast_generation (generation=transformers_fast) decodes from a prepacked copy of the whole "
            f"policy on CPU, with torch's MKL or oneDNN kernels; this run is on {device}"
            + (" under DeepSpeed/FSDP" if sharded else "")
            + (f", and {unsupported}" if unsupported else "")
            + ". Use generation=transformers, or on a GPU generation=vllm_colocate / vllm_server"
        )


def fast_generation_pays(*, device: str, sharded: bool, trl_samples_elsewhere: bool) -> bool:
    """fast_generation's auto value: on where it was measured to pay, training on an x86-64 CPU (unsharded) whose
    torch prepacks, with TRL's transformers generation (not vLLM, not continuous batching)."""
    return device == "cpu" and not sharded and can_prepack() and x86_64() and not trl_samples_elsewhere


class Sampler:
    """One trainer's sampler of training batches: the copy (made at the first generation, from the policy as it is
    then) or None, TRL's generate() on the policy. `fast`: fast_generation as resolved (`fast_pays`: its auto
    value), off again where an auto one cannot run."""

    def __init__(self, bfloat16_generation: bool, fast_generation: bool | None, fast_pays: bool):
        self.bfloat16 = bfloat16_generation
        self.fast_asked = bool(fast_generation)
        self.fast = fast_pays if fast_generation is None else fast_generation
        if fast_generation is None and self.fast:
            log.info(
                "generation: a copy of the policy with prepacked weights samples on this CPU, the policy's own "
                "distribution (trainer.fast_generation=false: TRL's generate() on the policy)"
            )
        self.copy: SamplingCopy | None = None

    def copy_dtype(self, policy) -> torch.dtype:
        return torch.bfloat16 if self.bfloat16 else policy.dtype

    def copy_to_sample(self, policy, probe: list[int]) -> SamplingCopy | None:
        """The copy that samples a training batch of text prompts (`probe`: one of them), made at the first call;
        None: TRL's generate() samples. A policy already in the copy's dtype samples exactly as it is: no copy
        unless it decodes faster."""
        dtype = self.copy_dtype(policy)
        if not (self.fast or dtype != policy.dtype):
            return None
        if self.copy is None:
            self.copy = self._new_copy(policy, dtype, probe)
        return self.copy

    def model_for_turns(self, policy, probe: list[int], step: int):
        """The model a multi-turn rollout samples its turns from: the prepacked copy (fast_generation), refreshed
        from the policy once per step, else the policy itself. `probe`: token ids of a prompt (copy_to_sample)."""
        copy = self.copy_to_sample(policy, probe) if self.fast else None
        if copy is None:
            return policy
        copy.sync(policy, step)
        return copy.copy

    def generate(self, policy, prompt_ids: list[list[int]], generation_config, step: int, with_log_probs: bool):
        """The copy's completions (refreshed from the policy once per step) and, `with_log_probs`, its
        log-probability of each token (grpo_exp.trainer.mismatch compares them with the trainer's)."""
        self.copy.sync(policy, step)
        return self.copy.generate(prompt_ids, generation_config, with_log_probs=with_log_probs)

    @contextlib.contextmanager
    def generating(self):
        """A step's generation (resampled batches included): the copy's weights are freed when it ends, made again at
        the next step's sync, so that they are not held through the loss's forward and backward."""
        try:
            yield
        finally:
            if self.copy is not None:
                self.copy.release()

    def _new_copy(self, policy, dtype: torch.dtype, probe: list[int]) -> SamplingCopy | None:
        """The sampling copy; a prepacked one must reproduce the policy's logits on `probe` (a prompt). Where it does
        not (an architecture whose forward reads a Linear's weight, LoRA layers among them), or where this CPU cannot
        prepack the copy's dtype (bfloat16 without AVX-512: prepack_unsupported), auto fast_generation turns itself
        off with a warning, and an explicit one is refused."""
        if not self.fast:
            return SamplingCopy(policy, dtype)
        unsupported = prepack_unsupported(dtype)
        if unsupported is not None:
            policy_dtype = str(policy.dtype).removeprefix("torch.")
            cause = "trainer.bfloat16_generation=true" if dtype != policy.dtype else f"model.dtype={policy_dtype}"
            return self._fast_generation_off(policy, dtype, f"with {cause}, {unsupported}", f" or drop {cause}")
        try:
            return SamplingCopy(policy, dtype, prepack=True, probe=probe)
        except Exception as err:  # whatever a forward through the replaced layers raised
            why = f"the prepacked copy does not run this model ({type(err).__name__}: {err})"
            return self._fast_generation_off(policy, dtype, why)

    def _fast_generation_off(self, policy, dtype: torch.dtype, why: str, or_else: str = "") -> SamplingCopy | None:
        """An explicit fast_generation refused (UserError naming `why`); an auto one off, with a warning: the
        unpacked copy samples where the copy's dtype differs from the policy's, else TRL's generate()."""
        if self.fast_asked:
            raise UserError(f"trainer.fast_generation=true: {why}; use trainer.fast_generation=false{or_else}")
        sampler = SamplingCopy(policy, dtype) if dtype != policy.dtype else None
        instead = "TRL's generate()" if sampler is None else "an unpacked copy"
        log.warning("trainer.fast_generation (auto) is off: %s; %s samples", why, instead)
        self.fast = False
        return sampler
