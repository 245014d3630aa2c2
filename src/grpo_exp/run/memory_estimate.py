"""What a training run needs in memory, estimated before the policy loads: from the model's architecture (its config,
no weights), the trainer's settings and the prompts' length. As accelerate's `estimate-memory` does for the weights,
plus what training adds: gradients, AdamW's two moments, the loss forward's activations, the generation's KV cache,
and grpo_exp's copies (the sampling copy, the float64 reference, TRL's reference model). Checked against measured peaks
in docs/scale.md (benchmarks.scale).

The step's peak is the largest of its phases: generation (the weights, the optimiser's moments, the sampling copy and
the KV cache: no gradients then, TRL sets them to None after each step), the loss's forward and the backward's start
(the weights, the moments, the activations and the LM head's buffers) and the backward's end (the weights, the moments
and the gradients).
"""

import logging
import os
from dataclasses import dataclass, field, replace

import psutil
import torch
from transformers import PretrainedConfig

from grpo_exp.errors import UserError
from grpo_exp.trainer.shared_prompt import MAX_PACKED_TOKENS, windowed

log = logging.getLogger(__name__)

GIB = 2**30
# What a process holds before any model: torch, transformers, TRL and the vLLM modules TRL imports (measured on CPU:
# 0.85 GiB after `from trl import GRPOTrainer`, docs/scale.md). Not in a GPU's allocated bytes.
RUNTIME_BYTES_CPU = int(0.9 * GIB)
# Activations the loss forward keeps for the backward, per token, in elements: each decoder layer hidden_size x
# HIDDEN_ACTIVATIONS + intermediate_size x MLP_ACTIVATIONS + the keys' or values' width (kv_size), and hidden_size x
# OUTSIDE_LAYERS besides (the final norm's input and output). Counted with autograd's saved-tensor hooks, each storage
# once, on one and two layers of the Qwen2.5 shapes: 14,352 elements a layer at 0.5B, 25,870 at 1.5B, 32,530 at 3B and
# 56,350 at 7B, each this count plus 2 + a float per attention head (docs/scale.md).
HIDDEN_ACTIVATIONS = 5
MLP_ACTIVATIONS = 2
OUTSIDE_LAYERS = 2
# TRL's fused LM head (grpo_exp.trainer.lm_head_tile): its backward holds about this many [tile tokens x 32,768]
# float32 buffers at once (measured alone: 3.15 GB for a 2,864-token tile, 8.4 buffers; docs/scale.md).
HEAD_TILE_BUFFERS = 8
HEAD_VOCABULARY_CHUNK = 32768  # TRL's _CHUNKED_LOGPROB_CHUNK_SIZE


@dataclass(frozen=True)
class RunShape:
    """What the estimate reads of a run (plain values, so that it is a pure function)."""

    parameters: int  # the policy's
    hidden_size: int
    intermediate_size: int
    layers: int
    kv_size: int  # key/value heads x head dimension
    vocab_size: int
    weight_bytes: int  # a trained weight's (float32 master weights unless LoRA)
    compute_bytes: int  # an activation's (bfloat16 under autocast)
    trainable: int  # parameters the optimiser updates
    rows: int  # completions a process's loss forward takes at once (its micro-batch)
    tokens: int  # a row's length: the longest prompt + the completion limit
    prompt_tokens: int = 0  # the longest prompt's
    # G where the loss forward packs each group's completions behind one copy of its prompt
    # (trainer.shared_prompt_forward); 0: TRL's rows, each completion behind its own copy
    packed_group: int = 0
    gradient_checkpointing: bool = False
    head_tile_tokens: int = 1024  # trainer.lm_head_tile_tokens
    copies: dict[str, int] = field(default_factory=dict)  # grpo_exp's copies of the weights, by setting, in bytes
    on_gpu: bool = False
    generates: bool = True  # the process generates (not a vLLM server elsewhere): it holds the KV cache


@dataclass(frozen=True)
class MemoryEstimate:
    phases: dict[str, int]  # bytes at each phase's peak
    parts: dict[str, int]  # what the peak phase holds, by part

    @property
    def total(self) -> int:
        return max(self.phases.values())

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)


def loss_tokens(shape: RunShape) -> int:
    """The tokens the loss forward reads at once: TRL's rows, or one pack a group, its completions behind one copy of
    the prompt (grpo_exp.trainer.shared_prompt), where the pack is short enough to be packed (the packs padded to the
    longest: the longest prompt)."""
    rows = shape.rows * shape.tokens
    if not shape.packed_group:
        return rows
    branches = min(shape.packed_group, shape.rows)
    pack = shape.prompt_tokens + branches * (shape.tokens - shape.prompt_tokens + 1)
    return rows if pack > MAX_PACKED_TOKENS else -(-shape.rows // branches) * pack


def activation_bytes(shape: RunShape) -> int:
    """The loss forward's activations kept for the backward (with gradient checkpointing: each layer's input, and one
    layer's whole set while it is recomputed)."""
    per_layer_token = shape.hidden_size * HIDDEN_ACTIVATIONS + shape.intermediate_size * MLP_ACTIVATIONS + shape.kv_size
    kept_layers = shape.layers * shape.hidden_size + per_layer_token if shape.gradient_checkpointing else None
    per_token = (kept_layers or shape.layers * per_layer_token) + shape.hidden_size * OUTSIDE_LAYERS
    return loss_tokens(shape) * shape.compute_bytes * per_token


def lm_head_bytes(shape: RunShape) -> int:
    """TRL's fused LM head's buffers in the loss's backward: a few tiles of float32 logits."""
    tile_tokens = min(loss_tokens(shape), shape.head_tile_tokens)
    return HEAD_TILE_BUFFERS * tile_tokens * min(shape.vocab_size, HEAD_VOCABULARY_CHUNK) * 4


def estimate(shape: RunShape) -> MemoryEstimate:
    """The peak of a training step, by phase (a pure function of the run's shape)."""
    runtime = 0 if shape.on_gpu else RUNTIME_BYTES_CPU
    weights = shape.parameters * shape.weight_bytes
    moments = 2 * shape.trainable * 4  # AdamW's, float32
    gradients = shape.trainable * 4
    kv_cache = 2 * shape.layers * shape.kv_size * shape.rows * shape.tokens * shape.compute_bytes * shape.generates
    sampling = shape.copies.get("sampling copy", 0)
    held = {k: v for k, v in shape.copies.items() if k != "sampling copy"}  # the reference model: held all along
    always = {"runtime": runtime, "weights": weights, "optimiser moments": moments} | held
    generation = always | {"sampling copy": sampling, "KV cache": kv_cache}
    # The backward frees each layer's activations as it makes that layer's gradients: both at their full size never
    # coexist. Its peak is at one end: its start (every activation, the LM head's tiles and its gradient) or its end
    # (every gradient).
    head_gradient = shape.vocab_size * shape.hidden_size * 4 if shape.trainable == shape.parameters else 0
    backward_start = always | {
        "activations": activation_bytes(shape),
        "LM head tiles": lm_head_bytes(shape),
        "LM head gradient": head_gradient,
    }
    backward_end = always | {"gradients": gradients}
    phases = {
        "generation": sum(generation.values()),
        "loss forward and backward": sum(backward_start.values()),
        "end of the backward": sum(backward_end.values()),
    }
    parts = {"generation": generation, "loss forward and backward": backward_start, "end of the backward": backward_end}
    peak = max(phases, key=phases.get)
    return MemoryEstimate(phases, {k: v for k, v in parts[peak].items() if v})


# ---- from a run's config ---------------------------------------------------------------------------------------


def lora_parameters(config: PretrainedConfig, r: int) -> int:
    """LoRA adapters' parameters on every Linear of the decoder layers (all-linear): r x (in + out) each."""
    h, i, kv = config.hidden_size, config.intermediate_size, _kv_size(config)
    per_layer = r * ((h + h) + (h + kv) * 2 + (h + h) + (h + i) * 2 + (i + h))
    return per_layer * config.num_hidden_layers


def _kv_size(config: PretrainedConfig) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_key_value_heads * head_dim


def run_shape(config: PretrainedConfig, parameters: int, settings: dict) -> RunShape:
    """The run's shape from the model's config and `settings`: weight_bytes, compute_bytes, rows, tokens,
    prompt_tokens, packed_group, lora_r (None: full fine-tuning), gradient_checkpointing, head_tile_tokens, copies,
    on_gpu, generates."""
    lora_r = settings.get("lora_r")
    trainable = parameters if lora_r is None else lora_parameters(config, lora_r)
    return RunShape(
        parameters=parameters,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        layers=config.num_hidden_layers,
        kv_size=_kv_size(config),
        vocab_size=config.vocab_size,
        weight_bytes=settings["weight_bytes"],
        compute_bytes=settings["compute_bytes"],
        trainable=trainable,
        rows=settings["rows"],
        tokens=settings["tokens"],
        prompt_tokens=settings.get("prompt_tokens", 0),
        packed_group=0 if windowed(config) else settings.get("packed_group", 0),  # a windowed model is not packed
        gradient_checkpointing=settings.get("gradient_checkpointing", False),
        head_tile_tokens=settings.get("head_tile_tokens", 1024),
        copies=settings.get("copies", {}),
        on_gpu=settings.get("on_gpu", False),
        generates=settings.get("generates", True),
    )


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


def describe(estimate_: MemoryEstimate) -> str:
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in estimate_.parts.items())
    return f"{estimate_.total_gib:.1f} GiB at its peak ({estimate_.peak_phase}: {parts})"


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
    settings = {
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
        return replace(self.shape, tokens=self.prompt_tokens + length)


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
