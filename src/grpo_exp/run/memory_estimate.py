"""What a training run needs in memory, estimated before the policy loads: from the model's architecture (its config,
no weights), the trainer's settings and the prompts' length. As accelerate's `estimate-memory` does for the weights,
plus what training adds: gradients, AdamW's two moments, the loss forward's activations, the generation's KV cache,
and grpo_exp's copies (the sampling copy, the float64 reference, TRL's reference model). Checked against measured peaks
in docs/scale.md (benchmarks.scale).

The step's peak is the largest of its phases: generation (the weights, the optimiser's moments, the sampling copy and
the KV cache: no gradients then, TRL sets them to None after each step), the loss's forward and the backward's start
(the weights, the moments, the activations and the LM head's buffers) and the backward's end (the weights, the moments
and the gradients).

Pure functions of a RunShape; grpo_exp.run.memory_check reads a run's shape from its config and checks it.
"""

from dataclasses import dataclass, field, replace

from transformers import PretrainedConfig

from grpo_exp.trainer.shared_prompt import MAX_PACKED_TOKENS, windowed

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
# TRL's SFTTrainer (the warm-up, warmup=sft) computes its loss from the whole logits: its step's peak held 5.25
# float32 copies of rows x length x vocabulary beyond the model's state (measured with the tiny model's 49,152-token
# vocabulary, 8 x 256 and 4 x 512 tokens alike, docs/scale.md)
SFT_LOGIT_COPIES = 5.25


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
    # the warm-up stage before GRPO (warmup=sft): the rows a process's SFT forward takes at once (0: no warm-up), their
    # length, and whether its batch is accumulated over several (the gradients held across them)
    warmup_rows: int = 0
    warmup_tokens: int = 0
    warmup_accumulates: bool = False


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


def warmup_phase(shape: RunShape, always: dict[str, int]) -> dict[str, int]:
    """The warm-up's SFT step (TRL's SFTTrainer on the policy, its own AdamW): the loss's whole logits and the
    activations of its rows, with the gradients where it accumulates them over micro-batches (else the larger of
    those and the gradients alone, as in the GRPO step's backward)."""
    unpacked = replace(shape, rows=shape.warmup_rows, tokens=shape.warmup_tokens, packed_group=0)
    forward = {
        "activations": activation_bytes(unpacked),
        "logits": int(SFT_LOGIT_COPIES * shape.warmup_rows * shape.warmup_tokens * shape.vocab_size * 4),
    }
    gradients = shape.trainable * 4
    if shape.warmup_accumulates:
        return always | forward | {"gradients": gradients}
    return always | (forward if sum(forward.values()) >= gradients else {"gradients": gradients})


def estimate(shape: RunShape) -> MemoryEstimate:
    """The peak of a training step, by phase (a pure function of the run's shape); with a warm-up (warmup=sft), its
    SFT step is a phase too."""
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
    if shape.warmup_rows:
        # before GRPO's trainer exists: no reference model nor sampling copy yet; the frozen scorers are loaded
        before_grpo = {k: v for k, v in always.items() if k not in ("reference model",)}
        parts["warm-up (SFT)"] = warmup_phase(shape, before_grpo)
        phases["warm-up (SFT)"] = sum(parts["warm-up (SFT)"].values())
    peak = max(phases, key=phases.get)
    return MemoryEstimate(phases, {k: v for k, v in parts[peak].items() if v})


# ---- from a model's config ---------------------------------------------------------------------------------------


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
    on_gpu, generates, warmup_rows, warmup_tokens, warmup_accumulates."""
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
        warmup_rows=settings.get("warmup_rows", 0),
        warmup_tokens=settings.get("warmup_tokens", 0),
        warmup_accumulates=settings.get("warmup_accumulates", False),
    )


def describe(estimate_: MemoryEstimate) -> str:
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in estimate_.parts.items())
    return f"{estimate_.total_gib:.1f} GiB at its peak ({estimate_.peak_phase}: {parts})"
