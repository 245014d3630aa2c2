"""Settings that act only given another: a value of one of them that this run would ignore is refused, naming both
keys (the resolve phase, before anything is checked further).

Each rule names the options that act only under a condition on the whole config (`ONLY_WITH`, in the order they
are checked: a section's switch before the options inside it). An option is refused when the condition does not
hold and its value is one the user gave: not the schema's default, nor a value a config group option of conf/ gives
it (judge=local's judge.max_new_tokens, model=tiny's model.architecture: choosing model=tiny is not setting them).
An option that says which option of its group was chosen (judge.backend, scorer.name) counts as given unless it is
the schema's default. A section (`judge`) stands for every option under it, but those in `but`.
"""

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.rollout.tools.user import is_import_path
from grpo_exp.run.tracking import redact
from grpo_exp.schema import (
    AlarmAction,
    DataSource,
    JudgeBackend,
    JudgeMode,
    LoggerBackend,
    ModelSource,
    RolloutName,
    ScorerName,
    SelfVerifyBalance,
    SelfVerifyObjective,
    SelfVerifySchedule,
    ToolCalling,
    TurnCredit,
    ZeroVarianceGroups,
)

HEALTH_ALARMS = ("entropy_alarm", "truncation", "no_signal", "answer_collapse")  # health.window serves each
LOCAL_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")  # grpo_exp.data.FILE_BUILDERS: a path read as a local file
CHOICE_KEYS = ("backend", "name", "source")  # what a group's option is: given unless the schema's default


@dataclass(frozen=True)
class OnlyWith:
    """`keys` act only when `active(cfg)`: `when` says when, `here(cfg)` what this run has instead (naming the key
    that turns them off), `fix` what to set."""

    keys: tuple[str, ...]
    active: Callable[[DictConfig], bool]
    when: str
    here: Callable[[DictConfig], str]
    fix: str | Callable[[DictConfig], str]
    but: tuple[str, ...] = ()


def _plays_textarena(cfg: DictConfig) -> bool:
    """Whether rollout.environment names a TextArena game (one path, or one of a mapping's)."""
    setting = cfg.rollout.environment
    paths = [setting] if isinstance(setting, str) else list(setting.values()) if setting else []
    return any(str(path).startswith("textarena/") for path in paths)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _correction(cfg: DictConfig) -> str:
    correction = cfg.trainer.mismatch_correction
    return "null (the path's own)" if correction is None else correction.value


def _mix(cfg: DictConfig) -> list[str]:
    return list(cfg.reward.components)


def _hub_id(cfg: DictConfig) -> bool:
    """dataset.source=hub with a dataset id (not local files, which are read as dataset=files reads them)."""
    data = cfg.dataset
    return data.source is DataSource.hub and Path(str(data.path or "")).suffix not in LOCAL_DATA_SUFFIXES


def _needs_p_yes(cfg: DictConfig) -> bool:
    return bool({"confidence", "selfverify"} & set(_mix(cfg)))


def _selfverify(key: str) -> str:
    return f"reward.components.selfverify.{key}"


def _dataset_here(cfg: DictConfig) -> str:
    return f"this run's dataset={cfg.dataset.name} has dataset.source={cfg.dataset.source.value}"


def _sv(cfg: DictConfig) -> DictConfig:
    return cfg.reward.components.selfverify


def _joint_with(key: str, balance: SelfVerifyBalance, what: str = "") -> OnlyWith:
    """A selfverify setting that acts only in the joint schedule under one balance."""
    return OnlyWith(
        (_selfverify(key),),
        lambda cfg: _sv(cfg).schedule is SelfVerifySchedule.joint and _sv(cfg).balance is balance,
        f"by schedule=joint with balance={balance.value}{what}",
        lambda cfg: (
            f"{_selfverify('schedule')}={_sv(cfg).schedule.value}, {_selfverify('balance')}={_sv(cfg).balance.value}"
        ),
        f"set {_selfverify('schedule')}=joint and {_selfverify('balance')}={balance.value}",
    )


ONLY_WITH: tuple[OnlyWith, ...] = (
    # ---- model
    OnlyWith(
        ("model.lora",),
        lambda cfg: cfg.model.lora.enabled,
        "when LoRA adapters train (model.lora.enabled=true)",
        lambda cfg: "model.lora.enabled=false trains all weights",
        "set model.lora.enabled=true too",
        but=("model.lora.enabled",),
    ),
    OnlyWith(
        ("model.name_or_path", "model.trust_remote_code"),
        lambda cfg: cfg.model.source is ModelSource.pretrained,
        "for a hub id or local directory (model=pretrained)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=pretrained",
    ),
    OnlyWith(
        ("model.gguf_package", "model.gguf_file"),
        lambda cfg: cfg.model.source in (ModelSource.embedded, ModelSource.tiny),
        "for the embedded model and the tiny model's tokenizer (model.source=embedded or tiny)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=smollm2_135m or model=tiny",
    ),
    OnlyWith(
        ("model.architecture",),
        lambda cfg: cfg.model.source is ModelSource.tiny,
        "for the tiny random model (model.source=tiny)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=tiny",
    ),
    # ---- dataset: each source reads its own options
    OnlyWith(
        ("dataset.task", "dataset.task_config", "dataset.tasks", "dataset.levels"),
        lambda cfg: cfg.dataset.source is DataSource.reasoning_gym,
        "for a reasoning-gym task (dataset.source=reasoning_gym)",
        _dataset_here,
        "use a reasoning-gym dataset (dataset=arith, chain_sum, legs, gsm_symbolic, reasoning_gym_mix)",
    ),
    OnlyWith(
        ("dataset.function", "dataset.function_args"),
        lambda cfg: cfg.dataset.source is DataSource.function,
        "with dataset=function",
        _dataset_here,
        "add dataset=function",
    ),
    OnlyWith(
        ("dataset.path",),
        lambda cfg: cfg.dataset.source in (DataSource.files, DataSource.hub),
        "for files or a hub dataset (dataset.source=files or hub)",
        _dataset_here,
        "use dataset=files (or a hub dataset)",
    ),
    OnlyWith(
        ("dataset.question_field", "dataset.answer_field"),
        lambda cfg: cfg.dataset.source is not DataSource.reasoning_gym,
        "for rows of files, a hub dataset or dataset=function (a reasoning-gym task has its own)",
        _dataset_here,
        "use dataset=files, dataset=function or a hub dataset",
    ),
    OnlyWith(
        ("dataset.eval_path",),
        lambda cfg: (
            cfg.dataset.source is DataSource.files or (cfg.dataset.source is DataSource.hub and not _hub_id(cfg))
        ),
        "for local files (dataset.source=files, or dataset.path a .jsonl/.json/.parquet file)",
        lambda cfg: _dataset_here(cfg) + (f" and dataset.path={cfg.dataset.path} (its splits)" if _hub_id(cfg) else ""),
        "use dataset=files with dataset.path",
    ),
    OnlyWith(
        ("dataset.hub_config",),
        _hub_id,
        "for a hub dataset id (dataset.source=hub)",
        _dataset_here,
        "use a hub dataset (dataset=gsm8k)",
    ),
    OnlyWith(
        ("dataset.train_split", "dataset.eval_split"),
        lambda cfg: _hub_id(cfg) or cfg.dataset.source is DataSource.function,
        "for a hub dataset's splits, or the mapping of splits a dataset function returns",
        _dataset_here,
        "use a hub dataset or dataset=function",
    ),
    OnlyWith(
        ("dataset.seed",),
        lambda cfg: not _hub_id(cfg),
        "to generate reasoning-gym problems and to carve the held-out split of files or a function's rows",
        lambda cfg: (
            f"this run's dataset={cfg.dataset.name} takes the hub's splits dataset.train_split and "
            "dataset.eval_split as they are"
        ),
        "use dataset=files (or leave the split to the hub)",
    ),
    # ---- the judge (the judge group), read only where the reward mix has it
    OnlyWith(
        ("judge",),
        lambda cfg: "judge" in _mix(cfg),
        "by the judge, a component of the reward mix (reward=...+judge)",
        lambda cfg: f"this run's reward={'+'.join(_mix(cfg))} has no judge",
        lambda cfg: f"add it to the mix (reward={'+'.join(_mix(cfg))}+judge)",
    ),
    OnlyWith(
        ("judge.dtype", "judge.batch_size"),
        lambda cfg: cfg.judge.backend is JudgeBackend.local,
        "by a local judge (judge=local)",
        lambda cfg: f"judge.backend={cfg.judge.backend.value} asks an endpoint",
        "use judge=local",
    ),
    OnlyWith(
        ("judge.base_url", "judge.api_key_env", "judge.concurrency", "judge.timeout"),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai,
        "by a judge behind an endpoint (judge=openai)",
        lambda cfg: f"judge.backend={cfg.judge.backend.value} loads the judge in-process",
        "use judge=openai",
    ),
    OnlyWith(
        ("judge.tokenizer",),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai and cfg.judge.mode is JudgeMode.scores,
        "by a judge behind an endpoint in judge.mode=scores (it renders the prompt)",
        lambda cfg: f"this run's judge has judge.backend={cfg.judge.backend.value}, judge.mode={cfg.judge.mode.value}",
        "use judge=openai with judge.mode=scores",
    ),
    OnlyWith(
        ("judge.max_new_tokens", "judge.temperature", "judge.retry_temperature", "judge.retries"),
        lambda cfg: cfg.judge.mode is JudgeMode.text,
        "when the judge writes its reply (judge.mode=text)",
        lambda cfg: "judge.mode=scores reads the score tokens' probabilities, writing nothing",
        "set judge.mode=text too",
    ),
    OnlyWith(
        ("judge.response_format",),
        lambda cfg: cfg.judge.backend is JudgeBackend.openai and cfg.judge.mode is JudgeMode.text,
        "by a judge behind an endpoint writing its reply (judge=openai, judge.mode=text)",
        lambda cfg: f"this run's judge has judge.backend={cfg.judge.backend.value}, judge.mode={cfg.judge.mode.value}",
        "use judge=openai with judge.mode=text",
    ),
    # ---- the P(Yes) scorer (the scorer group; the correctness labels, verifier.labels, act in every run)
    OnlyWith(
        ("scorer.name",),
        _needs_p_yes,
        "by what reads a P(Yes): the reward components confidence and selfverify",
        lambda cfg: f"this run's reward={'+'.join(_mix(cfg))} has neither",
        "add one to the reward mix",
    ),
    OnlyWith(
        ("scorer.template", "scorer.yes_token", "scorer.no_token", "scorer.batch_size"),
        lambda cfg: _needs_p_yes(cfg) and cfg.scorer.name is not ScorerName.none,
        "by the P(Yes) scorer of scorer=genrm or scorer=self, for the confidence and selfverify components",
        lambda cfg: (
            f"this run's reward={'+'.join(_mix(cfg))} with scorer={cfg.scorer.name.value} reads none"
            if cfg.scorer.name is not ScorerName.none or not _needs_p_yes(cfg)
            else "scorer.name=none has no P(Yes) scorer (the policy's own, with its defaults, is read)"
        ),
        "use scorer=genrm or scorer=self with confidence or selfverify in the reward mix",
    ),
    OnlyWith(
        ("scorer.model", "scorer.base_url", "scorer.api_key_env"),
        lambda cfg: cfg.scorer.name is ScorerName.genrm,
        "by a frozen verifier (scorer=genrm)",
        lambda cfg: f"scorer.name={cfg.scorer.name.value}",
        "use scorer=genrm",
    ),
    # ---- the reward components' own settings
    OnlyWith(
        (_selfverify("every"),),
        lambda cfg: _sv(cfg).schedule is SelfVerifySchedule.interleave,
        "by the interleaved schedule (a verification step every N steps)",
        lambda cfg: f"{_selfverify('schedule')}={_sv(cfg).schedule.value}",
        f"set {_selfverify('schedule')}=interleave too",
    ),
    _joint_with("fraction", SelfVerifyBalance.share, " (the share of a batch's groups that verify)"),
    _joint_with("pairs_per_step", SelfVerifyBalance.pairs),
    OnlyWith(
        (_selfverify("yes_share"), _selfverify("per_problem")),
        lambda cfg: _sv(cfg).balance is SelfVerifyBalance.share,
        "by balance=share",
        lambda cfg: f"{_selfverify('balance')}={_sv(cfg).balance.value} draws matched pairs",
        f"set {_selfverify('balance')}=share too",
    ),
    OnlyWith(
        (_selfverify("supervised_weight"),),
        lambda cfg: _sv(cfg).objective is SelfVerifyObjective.supervised,
        "by the supervised verdict loss (objective=supervised)",
        lambda cfg: f"{_selfverify('objective')}={_sv(cfg).objective.value}",
        f"set {_selfverify('objective')}=supervised too",
    ),
    OnlyWith(
        (_selfverify("loss_on"), _selfverify("scale_by_pass_rate")),
        lambda cfg: _sv(cfg).objective is SelfVerifyObjective.grpo,
        "when verification prompts join the GRPO batch (objective=grpo)",
        lambda cfg: f"{_selfverify('objective')}={_sv(cfg).objective.value} keeps them out of it",
        f"set {_selfverify('objective')}=grpo",
    ),
    # ---- the trainer
    OnlyWith(
        ("trainer.max_resample_batches",),
        lambda cfg: cfg.trainer.zero_variance_groups is ZeroVarianceGroups.resample,
        "by dynamic sampling (trainer.zero_variance_groups=resample)",
        lambda cfg: f"trainer.zero_variance_groups={cfg.trainer.zero_variance_groups.value} generates no extra batch",
        "set trainer.zero_variance_groups=resample too",
    ),
    OnlyWith(
        ("trainer.warmup_steps",),
        lambda cfg: cfg.trainer.lr_scheduler_type != "constant",
        "by a learning-rate schedule with a warm-up",
        lambda cfg: "trainer.lr_scheduler_type=constant has none",
        "set trainer.lr_scheduler_type=constant_with_warmup (or linear, cosine...)",
    ),
    OnlyWith(
        ("trainer.mismatch_clip_min", "trainer.mismatch_clip_max"),
        lambda cfg: cfg.trainer.mismatch_correction is not None and cfg.trainer.mismatch_correction.weighs,
        "by an importance-weighting correction",
        lambda cfg: f"trainer.mismatch_correction={_correction(cfg)} weighs nothing",
        "set trainer.mismatch_correction=token_truncate, token_mask, sequence_truncate or sequence_mask",
    ),
    OnlyWith(
        ("trainer.float64_reference_completions",),
        lambda cfg: cfg.trainer.float64_reference_every > 0,
        "by the float64 reference",
        lambda cfg: "trainer.float64_reference_every=0 takes none",
        "set trainer.float64_reference_every to a number of steps",
    ),
    OnlyWith(
        ("trainer.extra.vllm_gpu_memory_utilization", "trainer.extra.vllm_enable_sleep_mode"),
        lambda cfg: _has_cuda(),
        "by vLLM on a CUDA GPU",
        lambda cfg: (
            "this machine has none (vLLM's CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE and has no "
            "sleep mode)"
        ),
        "on CPU set the environment variable VLLM_CPU_KVCACHE_SPACE (GiB; grpo_exp's default 1)",
    ),
    OnlyWith(
        ("trainer.weight_sync_steps",),
        lambda cfg: cfg.trainer.max_staleness is not None,
        "by generation ahead (generation=vllm_async)",
        lambda cfg: "trainer.max_staleness=null generates synchronously (TRL syncs the weights every step)",
        "add generation=vllm_async (or set trainer.max_staleness)",
    ),
    # ---- the rollout
    OnlyWith(
        ("rollout",),
        lambda cfg: cfg.rollout.name is RolloutName.multiturn,
        "by the multi-turn rollout (rollout=multiturn)",
        lambda cfg: f"this run has rollout={cfg.rollout.name.value}",
        "add rollout=multiturn",
        but=("rollout.name",),
    ),
    OnlyWith(
        (
            "rollout.environment_timeout_s",
            "rollout.environment_success_at",
            "rollout.environment_max_failure_rate",
            "rollout.environment_failure_window",
            "rollout.tool_calling",
        ),
        lambda cfg: cfg.rollout.environment is not None,
        "by an environment (rollout=environment)",
        lambda cfg: "rollout.environment=null has none",
        "set rollout=environment rollout.environment=module:Class",
    ),
    OnlyWith(
        ("rollout.invalid_move_credit",),
        _plays_textarena,
        "by TextArena's games (rollout.environment=textarena/<game>)",
        lambda cfg: f"rollout.environment={cfg.rollout.environment} plays no TextArena game",
        "set rollout.environment=textarena/<game>",
    ),
    OnlyWith(
        ("rollout.discount",),
        lambda cfg: cfg.rollout.turn_credit is TurnCredit.discounted_return,
        "by the per-turn credit (rollout.turn_credit=discounted_return)",
        lambda cfg: "rollout.turn_credit=outcome credits the whole outcome to every turn",
        "set rollout.turn_credit=discounted_return",
    ),
    OnlyWith(
        ("rollout.cache_turns",),
        lambda cfg: cfg.rollout.tool_calling is not ToolCalling.native,
        "by grpo_exp's multi-turn loop",
        lambda cfg: "rollout.tool_calling=native plays the turns in TRL's own loop",
        "drop rollout.tool_calling=native",
    ),
    OnlyWith(
        ("rollout.python",),
        lambda cfg: "python" in cfg.rollout.tools,
        "by the python tool's sandbox",
        lambda cfg: f"rollout.tools={list(cfg.rollout.tools)} has no python",
        "add python to rollout.tools",
    ),
    OnlyWith(
        ("rollout.describe_tools",),
        lambda cfg: cfg.rollout.environment is not None or any(is_import_path(tool) for tool in cfg.rollout.tools),
        "to describe your own tools (import paths in rollout.tools) or your environment's methods",
        lambda cfg: f"rollout.tools={list(cfg.rollout.tools)} has none of yours and there is no rollout.environment",
        "add your tool to rollout.tools",
    ),
    # ---- evaluation, statistics, logging
    OnlyWith(
        tuple(
            f"eval.{key}"
            for key in ("every_problems", "every_samples", "best_metric", "keep_top_k", "patience", "stop_at", "alarm")
        ),
        lambda cfg: bool(cfg.eval.every),
        "by validations while training (eval.every=N)",
        lambda cfg: "eval.every=0 runs none",
        "set eval.every too",
    ),
    OnlyWith(
        ("health.collapse_below", "health.blowup_above"),
        lambda cfg: cfg.health.entropy_alarm is not AlarmAction.off,
        "by the entropy alarm",
        lambda cfg: "health.entropy_alarm=off",
        "set health.entropy_alarm=warn or stop",
    ),
    OnlyWith(
        ("health.truncation_share",),
        lambda cfg: cfg.health.truncation is not AlarmAction.off,
        "by the truncation warning",
        lambda cfg: "health.truncation=off",
        "set health.truncation=warn or stop",
    ),
    OnlyWith(
        ("health.answer_collapse_share",),
        lambda cfg: cfg.health.answer_collapse is not AlarmAction.off,
        "by the answer-collapse alarm",
        lambda cfg: "health.answer_collapse=off",
        "set health.answer_collapse=warn or stop",
    ),
    OnlyWith(
        ("health.window",),
        lambda cfg: {cfg.health[key] for key in HEALTH_ALARMS} != {AlarmAction.off},
        "by the health alarms",
        lambda cfg: " and ".join(f"health.{key}=off" for key in HEALTH_ALARMS),
        "set one of them to warn or stop",
    ),
    OnlyWith(
        ("probe.problems",),
        lambda cfg: (
            cfg.probe.before_training is not AlarmAction.off
            or (
                cfg.probe.labels_check is not AlarmAction.off
                and not cfg.eval.before
                and cfg.rollout.name is RolloutName.single
            )
        ),
        "by the reward probe and, single-turn without eval.before, the labels check",
        lambda cfg: "probe.before_training=off" + ("" if cfg.eval.before else " and probe.labels_check=off"),
        "set probe.before_training=warn or stop (or run grpo-exp probe)",
    ),
    OnlyWith(
        ("probe.labels_check",),
        lambda cfg: cfg.rollout.environment is None or cfg.probe.labels_check is not AlarmAction.stop,
        "where answers are read by labels (an environment scores its episodes itself)",
        lambda cfg: "this run's rollout.environment scores them",
        "leave the default (warn), which an environment skips",
    ),
    OnlyWith(
        ("probe.attacks",),
        lambda cfg: cfg.probe.before_training is not AlarmAction.off,
        "by the reward probe: `grpo-exp probe`, or before a run with probe.before_training",
        lambda cfg: "probe.before_training=off",
        "set probe.before_training=warn or stop (or run grpo-exp probe)",
    ),
    OnlyWith(
        ("curriculum",),
        lambda cfg: cfg.curriculum.enabled,
        "by the curriculum over prompts' difficulty (curriculum.enabled=true)",
        lambda cfg: "curriculum.enabled=false",
        "set curriculum.enabled=true too",
        but=("curriculum.enabled",),
    ),
    OnlyWith(
        ("dataset.levels",),
        lambda cfg: cfg.dataset.levels.enabled,
        "by reasoning-gym's curricula (dataset.levels.enabled=true)",
        lambda cfg: "dataset.levels.enabled=false",
        "set dataset.levels.enabled=true too",
        but=("dataset.levels.enabled",),
    ),
    OnlyWith(
        ("eval.verification_benchmark",),
        lambda cfg: cfg.eval.verification_benchmark.enabled,
        "by the verification benchmark (eval.verification_benchmark.enabled=true)",
        lambda cfg: "eval.verification_benchmark.enabled=false",
        "set eval.verification_benchmark.enabled=true too",
        but=("eval.verification_benchmark.enabled",),
    ),
    OnlyWith(
        ("stats.table_every", "stats.table_groups"),
        lambda cfg: cfg.stats.enabled,
        "with the group statistics (stats.enabled=true)",
        lambda cfg: "stats.enabled=false",
        "set stats.enabled=true too",
    ),
    OnlyWith(
        ("logger.entity",),
        lambda cfg: cfg.logger.backend is LoggerBackend.wandb,
        "by W&B (logger=wandb)",
        lambda cfg: f"logger.backend={cfg.logger.backend.value}",
        "use logger=wandb",
    ),
    OnlyWith(
        ("logger.tracking_uri",),
        lambda cfg: cfg.logger.backend is LoggerBackend.mlflow,
        "by MLflow (logger=mlflow)",
        lambda cfg: f"logger.backend={cfg.logger.backend.value}",
        "use logger=mlflow",
    ),
    OnlyWith(
        ("logger.project", "logger.tags"),
        lambda cfg: cfg.logger.backend is not LoggerBackend.none,
        "by a tracker (logger=wandb, trackio, tensorboard or mlflow)",
        lambda cfg: "logger.backend=none logs to none",
        "choose a logger",
    ),
)


def check_only_with(cfg: DictConfig, read_by_caller: tuple[str, ...] = ()) -> None:
    """Every rule of ONLY_WITH, in order: the first option given a value that this run ignores is one UserError
    naming it, what would read it, and the setting of this run that turns it off. `read_by_caller`: the sections
    the command itself reads or replaces whatever the rest says (grpo_exp.evaluate: `model.`, a checkpoint in place
    of the run's model; grpo-exp probe: `probe.`), whose rules are then not checked."""
    written = _Written(cfg)
    for rule in ONLY_WITH:
        if rule.keys[0].startswith(read_by_caller):
            continue
        leaves = [leaf for key in rule.keys for leaf in _leaves(cfg, key) if leaf not in rule.but]
        given = [leaf for leaf in leaves if written.given(leaf)]
        if not given or rule.active(cfg):
            continue
        key, fix = given[0], rule.fix(cfg) if callable(rule.fix) else rule.fix
        raise UserError(
            f"{key}={_shown(written.value(key), key)} is read only {rule.when}, but {rule.here(cfg)}: {fix}, "
            f"or leave {key} out"
        )


def _leaves(cfg: DictConfig, key: str) -> list[str]:
    """The options at `key`: itself, or every option under a section (a node typed by a schema dataclass)."""
    node = OmegaConf.select(cfg, key, throw_on_missing=False)
    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(OmegaConf.get_type(node)):
        return [key] if _exists(cfg, key) else []
    return [leaf for child in node for leaf in _leaves(cfg, f"{key}.{child}")]


def _exists(cfg: DictConfig, key: str) -> bool:
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
    return isinstance(node, DictConfig) and name in node


def _raw(value: Any) -> Any:
    """A default as YAML would write it (enums by name)."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict | list):
        return OmegaConf.to_container(OmegaConf.create({"v": value}), enum_to_str=True)["v"]
    return value


class _Written:
    """The config as written (interpolations unresolved, enums by name), converted once: a check reads hundreds of
    its options, and converting a section per option was most of the resolve phase's time."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.tree = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
        self.schemas: dict[str, type | None] = {}  # a section's schema dataclass
        self.chosen: dict[str, Any] = {}

    def value(self, key: str) -> Any:
        node = self.tree
        for part in key.split("."):
            node = node[part]
        return node

    def given(self, key: str) -> bool:
        """The user gave `key` its value: neither the schema's default nor (but for a choice) a conf/ option's."""
        value = self.value(key)
        parent, _, name = key.rpartition(".")
        if value == _schema_default(self.schema(parent), name):
            return False
        if name in CHOICE_KEYS:
            return True
        return value not in _option_values(self, key)

    def schema(self, section: str) -> type | None:
        if section not in self.schemas:
            self.schemas[section] = OmegaConf.get_type(OmegaConf.select(self.cfg, section) if section else self.cfg)
        return self.schemas[section]

    def chosen_option(self, group: str) -> Any:
        """The option chosen in `group` (CHOSEN_BY)."""
        if group not in self.chosen:
            chosen = OmegaConf.select(self.cfg, f"{group}.{CHOSEN_BY[group]}")
            self.chosen[group] = getattr(chosen, "value", chosen)
        return self.chosen[group]


@functools.cache
def _schema_default(schema: type | None, name: str) -> Any:
    """The default a schema dataclass gives its field `name` (as YAML would write it); _NO_DEFAULT where none."""
    found = {f.name: f for f in dataclasses.fields(schema)}.get(name) if dataclasses.is_dataclass(schema) else None
    if found is None:
        return _NO_DEFAULT
    if found.default is not dataclasses.MISSING:
        default = found.default
    elif found.default_factory is not dataclasses.MISSING:
        default = found.default_factory()
    else:
        return _NO_DEFAULT
    if dataclasses.is_dataclass(default):
        return OmegaConf.to_container(OmegaConf.structured(default), enum_to_str=True)
    return _raw(default)


_NO_DEFAULT = object()


# The option chosen in these groups is known from the composed config: only its file's values count there.
CHOSEN_BY = {"dataset": "name", "model": "name", "rollout": "name", "scorer": "name", "judge": "backend"}
CHOSEN_BY |= {"logger": "backend"}


@functools.cache
def _option_files() -> tuple[tuple[str, str, DictConfig], ...]:
    """Every option file of conf/'s config groups, (its group, its name, its values placed at its package: its
    group's path, or its header's)."""
    placed = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR)
        if not group.parts or group.parts[0] == "hydra":
            continue
        text = path.read_text(encoding="utf-8")
        header = next((line for line in text.splitlines() if line.startswith("# @package")), None)
        package = header.split()[-1] if header else ".".join(group.parts)
        values = OmegaConf.create(text)
        if not isinstance(values, DictConfig):
            continue
        values.pop("defaults", None)
        values = values if package == "_global_" else OmegaConf.create(_nest(package, values))
        placed.append(("/".join(group.parts), path.stem, values))
    return tuple(placed)


def _nest(package: str, values: DictConfig) -> dict:
    nested: Any = values
    for part in reversed(package.split(".")):
        nested = {part: nested}
    return nested


def _option_values(written: _Written, key: str) -> list[Any]:
    """The values conf/'s options give `key`: in a group whose chosen option the config names (CHOSEN_BY), that
    option's alone."""
    found = []
    parent, _, name = key.rpartition(".")
    for group, option, values in _option_files():
        chosen = written.chosen_option(group) if group in CHOSEN_BY else None
        if chosen is not None and chosen != option:
            continue
        node = OmegaConf.select(values, parent, throw_on_missing=False) if parent else values
        if isinstance(node, DictConfig) and name in node:
            found.append(OmegaConf.to_container(node, resolve=False)[name])
    return found


def _shown(written_value: Any, key: str) -> str:
    """The value for the message: a secret's masked, a long one cut."""
    name = key.rpartition(".")[2]
    value = redact({name: written_value})[name]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
