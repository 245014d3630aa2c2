"""A run's memory, checked before the policy loads: its shape read from the config (the model's architecture, the
trainer's settings, the prompts' length, grpo_exp's copies), its estimate (grpo_exp.run.memory_estimate) against the
memory free where it trains, the settings that would make it fit, and whether freed tensors go back to the system at
once (trainer.return_freed_memory)."""

import logging
import os
from dataclasses import dataclass, replace

import psutil
import torch
from transformers import PretrainedConfig

from grpo_exp.errors import UserError
from grpo_exp.run.memory_estimate import (
    GIB,
    MemoryEstimate,
    RunShape,
    describe,
    estimate,
    lora_parameters,
    run_shape,
)

log = logging.getLogger(__name__)


def available_bytes(on_gpu: bool) -> tuple[int, str]:
    """Free memory where the policy trains, and what it is."""
    if on_gpu:
        return torch.cuda.mem_get_info()[0], "free on the GPU"
    return psutil.virtual_memory().available, "available on this machine"


def available_per_process(on_gpu: bool) -> tuple[int, str]:
    """available_bytes, a process's share: on CPU the processes of a node share its memory."""
    available, where = available_bytes(on_gpu)
    if not on_gpu:
        available //= max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    return available, where


# The share of the available memory above which a run on CPU hands freed tensors back at once (trainer.
# return_freed_memory=null): the default run takes a fifth of this 24 GiB machine, Qwen2.5-0.5B's shape at 512 tokens
# two fifths (docs/scale.md).
SCARCE_SHARE = 1 / 3


def hand_back_freed_memory(setting: bool | None, run: "RunEstimate | None") -> None:
    """trainer.return_freed_memory: true, false, or null (where the run's estimate takes over SCARCE_SHARE of the
    memory available on CPU); said in the log when on."""
    from grpo_exp.freed_memory import return_large_blocks_when_freed

    if setting is None:
        if run is None or run.shape.on_gpu:
            return
        available, where = available_per_process(on_gpu=False)
        if run.estimate.total <= SCARCE_SHARE * available:
            return
        why = f"this run needs about {run.total_gib:.1f} of the {available / GIB:.1f} GiB {where}"
    elif setting:
        why = "trainer.return_freed_memory=true"
    else:
        return
    if return_large_blocks_when_freed():
        log.info(
            "Memory: freed tensors of 1 MiB or more go back to the system at once (%s; trainer.return_freed_memory="
            "false keeps glibc's default, faster where memory is plenty)",
            why,
        )
    elif setting:
        log.warning("trainer.return_freed_memory=true: this C library has no mmap threshold to set (glibc's only)")


def check_fits(estimate_: MemoryEstimate, available: int, where: str, remedies: list[str]) -> None:
    """Refuses a run whose estimated peak exceeds `available`, naming what would make it fit; warns within 10%."""
    said = describe(estimate_)
    if estimate_.total > available:
        raise UserError(
            f"this run would need about {said}, more than the {available / GIB:.1f} GiB {where}. To fit: "
            + "; ".join(remedies)
            + " (docs/scale.md; health.memory=warn trains anyway)"
        )
    if estimate_.total > 0.9 * available:
        log.warning("This run needs about %s, close to the %.1f GiB %s", said, available / GIB, where)
    else:
        log.info("Memory: this run needs about %s; %.1f GiB %s", said, available / GIB, where)


def model_config(model_cfg, cache_dir: str) -> PretrainedConfig:
    """The policy's architecture, without its weights."""
    from transformers import AutoConfig, LlamaConfig

    from grpo_exp.model_shapes import shape_config
    from grpo_exp.models import materialise_embedded
    from grpo_exp.schema import ModelSource

    if model_cfg.source is ModelSource.shape:
        return shape_config(model_cfg.shape, model_cfg.architecture)
    if model_cfg.source is ModelSource.tiny:
        return LlamaConfig(vocab_size=TINY_VOCABULARY, **model_cfg.architecture)
    if model_cfg.source is ModelSource.embedded:
        return AutoConfig.from_pretrained(materialise_embedded(model_cfg, cache_dir))
    return AutoConfig.from_pretrained(model_cfg.name_or_path, trust_remote_code=model_cfg.trust_remote_code)


TINY_VOCABULARY = 49152  # the embedded tokenizer's, which the tiny model takes


def longest_prompt_tokens(tokenizer, prompts: list, count: int = 256) -> int:
    """The longest of the first `count` prompts, in tokens, as the chat template renders them."""
    from grpo_exp.generation import prompt_ids

    return max((len(prompt_ids(tokenizer, p)) for p in prompts[:count]), default=0)


def frozen_models(spec) -> list[tuple[str, object]]:
    """The frozen models a run loads in each process beside the policy (a P(Yes) scorer's, a local judge's), as
    model configs; the ones behind an endpoint load elsewhere."""
    from grpo_exp.models import model_option_config
    from grpo_exp.rewards.judge import LocalJudge
    from grpo_exp.rewards.registry import shared_needs
    from grpo_exp.schema import JudgeBackend, ScorerName

    cfg, frozen = spec.cfg, []
    if spec.needs_p_yes and cfg.scorer.name is ScorerName.genrm and not cfg.scorer.base_url:
        policy = cfg.scorer.model == "initial_policy"
        frozen.append(("P(Yes) scorer", cfg.model if policy else model_option_config(cfg.scorer.model, "scorer.model")))
    if "judge" in shared_needs(spec.components) and cfg.judge.backend is JudgeBackend.local:
        frozen.append(("local judge", LocalJudge(cfg.judge, "").model_cfg))
    return frozen


def _bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def estimate_run(spec, prompt_tokens: int | None = None) -> MemoryEstimate:
    """The training run's peak per process (on CPU, the processes of a node together share its memory)."""
    from grpo_exp.model_shapes import parameter_count
    from grpo_exp.models import load_tokenizer, torch_dtype, trained_dtype
    from grpo_exp.trainer.sampling import fast_generation_pays, runs_sharded, training_device

    cfg = spec.cfg
    t = cfg.trainer
    config = model_config(cfg.model, cfg.cache_dir)
    if prompt_tokens is None:
        from grpo_exp.data import load_splits

        train, _ = load_splits(cfg.dataset)
        prompt_tokens = longest_prompt_tokens(load_tokenizer(cfg.model, cfg.cache_dir), list(train["prompt"]))
    parameters = parameter_count(config)
    on_gpu = training_device(bool(t.extra.get("use_cpu", False))) == "cuda"
    compute_bytes = _bytes(torch_dtype(cfg.model.dtype))
    weight_bytes = _bytes(trained_dtype(cfg.model))
    use_vllm = bool(t.extra.get("use_vllm", False))
    copies = {}
    fast = t.fast_generation
    if fast is None:
        device = "cuda" if on_gpu else "cpu"
        fast = fast_generation_pays(device=device, sharded=runs_sharded(), trl_samples_elsewhere=use_vllm)
    if fast and t.fast_generation is None and cfg.model.lora.enabled:
        fast = False  # the prepacked copy does not run LoRA layers: auto fast_generation turns itself off
    if (fast or t.bfloat16_generation) and not use_vllm:
        copy_bytes = 2 if t.bfloat16_generation else weight_bytes
        tied_head = config.vocab_size * config.hidden_size if getattr(config, "tie_word_embeddings", False) else 0
        copies["sampling copy"] = (parameters + (tied_head if fast else 0)) * copy_bytes
    if t.float64_reference_every:
        copies["sampling copy"] = max(copies.get("sampling copy", 0), parameters * 8)  # held after generation, alone
    if t.beta > 0:
        copies["reference model"] = parameters * compute_bytes
    for name, frozen in frozen_models(spec):
        copies[name] = parameter_count(model_config(frozen, cfg.cache_dir)) * _bytes(torch_dtype(frozen.dtype))
    from grpo_exp.run.warmup.rules import warmup_rows_and_tokens

    warmup_rows, warmup_tokens = warmup_rows_and_tokens(cfg, spec.processes, prompt_tokens + t.max_completion_length)
    share = cfg.warmup.batch_size // spec.processes
    settings = {
        "warmup_rows": warmup_rows,
        "warmup_tokens": warmup_tokens,
        "warmup_accumulates": bool(warmup_rows) and warmup_rows < share,
        "weight_bytes": weight_bytes,
        "compute_bytes": compute_bytes,
        "rows": max(t.prompts_per_step * t.num_generations // spec.processes, 1),
        "tokens": prompt_tokens + t.max_completion_length,
        "prompt_tokens": prompt_tokens,
        "packed_group": t.num_generations if t.shared_prompt_forward else 0,
        "lora_r": cfg.model.lora.r if cfg.model.lora.enabled else None,
        "gradient_checkpointing": bool(t.extra.get("gradient_checkpointing", False)),
        "head_tile_tokens": t.lm_head_tile_tokens,
        "copies": copies,
        "on_gpu": on_gpu,
        "generates": not use_vllm or t.extra.get("vllm_mode") == "colocate",
    }
    return RunEstimate(config, run_shape(config, parameters, settings), prompt_tokens)


@dataclass(frozen=True)
class RunEstimate:
    """A run's estimate, with what it was computed from (to try the settings that would make it fit)."""

    config: PretrainedConfig
    shape: RunShape
    prompt_tokens: int

    @property
    def estimate(self) -> MemoryEstimate:
        return estimate(self.shape)

    @property
    def total_gib(self) -> float:
        return self.estimate.total_gib

    def remedies(self, cfg, available: int) -> list[str]:
        """The settings that would each make the run fit in `available` bytes, as overrides; where none does alone,
        the first of them together that do."""
        t, shape = cfg.trainer, self.shape
        fits = lambda candidate: estimate(candidate).total <= available  # noqa: E731
        changes = []  # (overrides, the shape with them), in the order a user would try them
        if not shape.gradient_checkpointing:
            changes.append(("+trainer.extra.gradient_checkpointing=true", {"gradient_checkpointing": True}))
        if not cfg.model.lora.enabled:
            # the prepacked copy does not run LoRA layers: auto fast_generation turns itself off
            held = {k: v for k, v in shape.copies.items() if k != "sampling copy" or t.bfloat16_generation}
            lora = {"trainable": lora_parameters(self.config, cfg.model.lora.r), "copies": held}
            changes.append(("model.lora.enabled=true", lora))
            if shape.weight_bytes > 2:  # the frozen weights in bfloat16 too
                changes.append(("model.lora.enabled=true model.dtype=bfloat16", lora | BFLOAT16))
        if shape.copies.get("sampling copy"):
            changes.append(("generation=vllm_server", {"copies": {}, "generates": False}))
        if shape.warmup_rows > 1:  # the warm-up's SFT logits, a row at a time
            changes.append(("warmup.micro_batch_size=1", {"warmup_rows": 1, "warmup_accumulates": True}))
        found = [overrides for overrides, change in changes if fits(replace(shape, **change))]
        group = next((g for g in range(t.num_generations - 1, 1, -1) if fits(self._with_group(g, t))), None)
        if group:
            found.append(f"trainer.num_generations={group}")
        length = next((n for n in _halvings(t.max_completion_length) if fits(self._with_length(n))), None)
        if length:
            found.append(f"trainer.max_completion_length={length}")
        if found:
            return found
        together, combined = [], shape
        for overrides, change in changes:
            if together and overrides.startswith(together[-1]):  # LoRA, then LoRA on bfloat16 weights: the latter
                together.pop()
            together.append(overrides)
            combined = replace(combined, **change)
            if fits(combined):
                return [" ".join(together)]
        return ["a smaller model, or a machine with more memory"]

    def _with_group(self, group: int, trainer_cfg) -> RunShape:
        rows = max(self.shape.rows * group // trainer_cfg.num_generations, 1)
        return replace(self.shape, rows=rows, packed_group=group if self.shape.packed_group else 0)

    def _with_length(self, length: int) -> RunShape:
        played = self.shape.warmup_tokens == self.shape.tokens  # a played episode is as long as a completion
        tokens = self.prompt_tokens + length
        return replace(self.shape, tokens=tokens, warmup_tokens=tokens if played else self.shape.warmup_tokens)


BFLOAT16 = {"weight_bytes": 2, "compute_bytes": 2}


def _halvings(length: int) -> list[int]:
    """length / 2, / 4, ... down to 16 tokens."""
    return [length >> k for k in range(1, 32) if length >> k >= 16]


def check_run_memory(spec, prompts: list, tokenizer) -> RunEstimate | None:
    """Before the policy loads: the run's estimated peak against the memory free where it trains (health.memory: stop
    refuses a run that would not fit, warn says so, off does not estimate)."""
    from grpo_exp.schema import AlarmAction

    action = AlarmAction(spec.cfg.health.memory)
    if action is AlarmAction.off:
        return None
    try:
        run = estimate_run(spec, longest_prompt_tokens(tokenizer, prompts))
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:
        # an architecture the estimate cannot read (no intermediate_size, remote code, a config it cannot fetch)
        log.info("Memory: not estimated for model=%s (%s: %s)", spec.cfg.model.name, type(err).__name__, err)
        return None
    available, where = available_per_process(run.shape.on_gpu)
    try:
        check_fits(run.estimate, available, where, run.remedies(spec.cfg, available))
    except UserError as err:
        if action is AlarmAction.stop:
            raise
        log.warning("%s", err)
    return run
