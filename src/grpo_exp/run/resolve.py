"""Resolve: the composed config -> the typed run spec, every check of a run made here, once, before anything is built.

The checks run in this order, each raising one UserError that names the key the user typed:
1. values the user must set; every path of the right kind (a file, a directory); every value's bounds (the schema's
   knob metadata, every float finite);
2. the reward components on their typed schemas (the mix's own settings and weights; a component of the user's
   own: its import path and signature, grpo_exp.rewards.custom), and the correctness labels (verifier.labels);
3. no value for a setting that this run would ignore (grpo_exp.run.inert: e.g. eval.patience without eval.every);
   then the rules between fields: the P(Yes) scorer a component needs, the judge's settings, the trainer's knobs (batch
   split, zero-variance groups, the sampling copy, pass-through GRPOConfig fields), the advantage estimator
   (algorithm.*) against them, the rollout, a component's task of its own (the self-verification task) against the
   trainer;
4. the world outside: data files, models and tokenizers named anywhere (local directory or hub), the checkpoint
   to resume from;
5. for training, TRL's own config (GRPOExpConfig) with GRPOConfig's own checks of the pass-through fields.
Build (grpo_exp.run.build) then goes down the floors once, from the spec, and checks nothing. What needs a loaded
tokenizer or model (a chat template, single-token verdicts or scores, a prepacked copy's probe) is checked where
that object is loaded.
"""

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_exp.answers import check_answer
from grpo_exp.data import check_data_files
from grpo_exp.errors import UserError
from grpo_exp.models import check_reachable, load_tokenizer, torch_dtype, trained_dtype
from grpo_exp.rewards.components import Task, graded_components
from grpo_exp.rewards.registry import (
    check_components,
    check_tasks,
    group_scalings,
    reward_weights,
    shared_needs,
    tasks,
    typed_components,
)
from grpo_exp.rewards.rubric import load_rubric_file
from grpo_exp.rollout.environment import check_environments, load_environments
from grpo_exp.rollout.native import WHY_NOT_NATIVE, why_not_native
from grpo_exp.rollout.tools import check_tool_names
from grpo_exp.run.distributed import world_size
from grpo_exp.run.inert import check_only_with
from grpo_exp.run.resume import Attempt, resolve_attempt
from grpo_exp.run.setting_paths import absolute_paths, check_paths
from grpo_exp.run.tracking import redact, report_to
from grpo_exp.run.validation import check_validation
from grpo_exp.run.warmup.rules import check_warmup
from grpo_exp.schema import (
    AlarmAction,
    RolloutName,
    ScaleRewards,
    ToolCalling,
    TurnCredit,
    check_values,
)
from grpo_exp.task_levels import check_levels
from grpo_exp.trainer.advantages import TRL_ADVANTAGES, check_algorithm, check_keeps_group_scale
from grpo_exp.trainer.async_generation import check_async_generation
from grpo_exp.trainer.config import GRPOExpConfig, check_trainer, grpo_exp_config
from grpo_exp.trainer.curriculum import check_curriculum
from grpo_exp.trainer.losses import is_trls
from grpo_exp.verification.labels import check_labels
from grpo_exp.verification.p_yes import check_scorer_reachable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """A checked run: the composed config on the schema's dataclasses (read-only, enums for every choice) and what
    is derived from it once."""

    cfg: DictConfig
    components: dict[str, DictConfig]  # reward component -> its typed settings, in the mix's order
    processes: int  # over which trainer.prompts_per_step is split
    policy_dtype: torch.dtype
    saved_config: dict  # the config with interpolations resolved and secrets redacted: config.yaml, trackers
    attempt: Attempt | None = None  # trainer.resume: the earlier attempt this run continues
    args: GRPOExpConfig | None = None  # TRL's config of the trainer (training only)
    # rollout.tool_calling resolved: the environments run through TRL's tool-calling loop (grpo_exp.rollout.native)
    native_tool_calling: bool = False

    @property
    def reward_weights(self) -> list[float]:
        return reward_weights(self.components)

    @property
    def eval_max_new_tokens(self) -> int:
        """Held-out answers are as long as training completions unless eval.max_new_tokens says otherwise."""
        return self.cfg.eval.max_new_tokens or self.cfg.trainer.max_completion_length

    @property
    def tasks(self) -> dict[str, Task]:
        """The tasks of their own that components of the mix bring the trainer (the self-verification task)."""
        return tasks(self.components)

    @property
    def multiturn(self) -> bool:
        return self.cfg.rollout.name is RolloutName.multiturn

    @property
    def needs_p_yes(self) -> bool:
        """A component of the mix reads a P(Yes) (the confidence reward, the self-verification metrics)."""
        return "p_yes" in shared_needs(self.components)


def resolve(
    cfg: DictConfig,
    processes: int | None = None,
    trainer_dir: Path | None = None,
    evaluating: bool = False,
    probing: bool = False,
) -> RunSpec:
    """`processes`: how many processes train together (default: this launch's); `trainer_dir`: where the trainer
    writes its checkpoints, for a training run (its GRPOExpConfig is made and checked too); `evaluating`: a
    checkpoint is evaluated in place of the config's model (grpo_exp.evaluate), whose own settings are not checked;
    `probing`: `grpo-exp probe` reads probe.* whatever probe.before_training says."""
    check_required(cfg)
    check_paths(cfg)
    load_rubric_file(cfg.judge)  # judge.rubric_file: its rubric replaces judge.rubric, recorded in the run's config
    check_values(cfg)
    components = typed_components(cfg.reward)
    saved_config = absolute_paths(redact(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)))
    spec = RunSpec(
        cfg=cfg,
        components=components,
        processes=world_size() if processes is None else processes,
        # training: the weights' dtype (float32 master weights under bfloat16 compute); evaluation: model.dtype
        policy_dtype=torch_dtype(cfg.model.dtype) if trainer_dir is None else trained_dtype(cfg.model),
        saved_config=saved_config,
    )
    check_verifier(spec)
    read_by_caller = ("model.",) * evaluating + ("probe.",) * probing
    check_only_with(cfg, read_by_caller)  # once each setting is known to be valid on its own
    check_components(spec.components, cfg, spec.processes)  # what each component of the mix declares
    check_trainer(cfg.trainer, spec.processes, multiturn=spec.multiturn, policy_dtype=spec.policy_dtype)
    check_algorithm(cfg.algorithm, cfg.trainer)
    environments, native = check_rollout(spec)
    spec = replace(spec, native_tool_calling=native)
    check_warmup(cfg, native, spec.processes)
    own_prompts = next((f"{task.what} (reward {name})" for name, task in spec.tasks.items()), None)
    check_async_generation(cfg, multiturn=spec.multiturn, own_prompts=own_prompts, native_tool_calling=native)
    probing = AlarmAction(spec.cfg.probe.before_training)
    if spec.multiturn and probing is not AlarmAction.off:
        raise UserError(
            f"probe.before_training={probing.value}: rollout=multiturn's rewards score whole tool conversations, "
            "which the probe's battery does not write yet: set probe.before_training=off"
        )
    check_tasks(spec.components, cfg)  # each task against the trainer and the estimator, checked by now
    for scaling in group_scalings(spec.components):
        check_keeps_group_scale(cfg.algorithm.name, ScaleRewards(cfg.trainer.scale_rewards), scaling)
    learned = tuple(name for name in spec.components if name in graded_components())
    check_validation(cfg.eval, cfg.trainer, learned, environments)
    check_curriculum(cfg.curriculum)
    if not evaluating:
        check_levels(cfg)
    check_data_files(cfg.dataset)
    check_reachable(cfg.model)
    attempt = resolve_attempt(cfg.trainer.resume, Path(cfg.outputs_dir), saved_config)
    args = None
    if trainer_dir is not None:
        bf16 = torch_dtype(cfg.model.dtype) == torch.bfloat16  # bfloat16 compute: autocast (mixed precision)
        args = grpo_exp_config(
            cfg.trainer,
            trainer_dir,
            report_to(cfg.logger),
            spec.reward_weights,
            bf16,
            spec.processes,
            cfg.algorithm,
            cfg.rollout if spec.multiturn else None,
            native_tool_calling=spec.native_tool_calling,
        )
    OmegaConf.set_readonly(cfg, True)  # what was checked is what runs
    return replace(spec, attempt=attempt, args=args)


def check_required(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"required value(s) not set: {', '.join(missing)} (add e.g. {missing[0]}=...)")


def check_verifier(spec: RunSpec) -> None:
    """The correctness labels (verifier.labels: a built-in, or the user's function by import path, its signature);
    the confidence reward needs a probability of correctness (the P(Yes) scorer, scorer.*); a frozen verifier named
    by path must exist."""
    check_labels(spec.cfg.verifier, spec.cfg.dataset)
    check_answer(spec.cfg.verifier.answer)
    if spec.needs_p_yes:
        check_scorer_reachable(spec.cfg.scorer, spec.cfg.model, spec.processes)


def check_rollout(spec: RunSpec) -> tuple[tuple[str, ...], bool]:
    """rollout=multiturn generates its turns itself, with the tools named and the environment's methods (the sampling
    copy's rules: the trainer). Returns the names of the run's environments, and whether they run through TRL's
    tool-calling loop (rollout.tool_calling)."""
    rollout = spec.cfg.rollout
    environment = rollout.environment if spec.multiturn else None
    if not spec.multiturn:
        return (), False
    for name in spec.tasks:  # the trainer mixes a task's prompts into single-turn batches only
        raise UserError(f"reward=...{name} with rollout=multiturn is not supported: use rollout=single")
    if environment is None or list(rollout.tools):
        check_tool_names(list(rollout.tools))
    if rollout.turn_credit is TurnCredit.discounted_return:
        check_turn_credit(spec.cfg)
    if environment is None:
        return (), False
    environments = load_environments(environment, rollout.environment_timeout_s, rollout)
    check_environments(environments, list(spec.components), list(rollout.tools))
    native = rollout.tool_calling is not ToolCalling.tags and check_native(spec.cfg)
    return tuple(env.name for env in environments.values()), native


def check_native(cfg: DictConfig) -> bool:
    """rollout.tool_calling=native | auto: whether TRL's tool-calling loop runs the environments. It must serve the
    model's chat template, and the run must ask nothing of it that only grpo_exp's loop does: native is refused
    saying why where either fails; auto then takes grpo_exp's loop (tags), saying why in the log. Loads the
    tokenizer (no model)."""
    asked = cfg.rollout.tool_calling
    check_reachable(cfg.model)
    why = why_not_native(load_tokenizer(cfg.model, cfg.cache_dir))
    if why is not None:
        reason = "rollout.tool_calling=native: " + WHY_NOT_NATIVE.format(model=cfg.model.name, why=why)
    else:
        reason = only_on_grpo_exps_loop(cfg)
    if reason is None:
        return True
    if asked is ToolCalling.native:
        raise UserError(reason)
    log.info("rollout.tool_calling=auto takes grpo_exp's loop (tags): %s", reason)
    return False


def only_on_grpo_exps_loop(cfg: DictConfig) -> str | None:
    """What of this run only grpo_exp's loop does, said as the refusal of TRL's loop (None: nothing)."""
    rollout = cfg.rollout
    native = f"rollout.tool_calling={rollout.tool_calling.value} runs the environments through TRL's tool-calling loop"
    only_tags = {
        "rollout.tools": (
            list(rollout.tools),
            "grpo_exp's tools are called with tags: make them methods of the environment",
        ),
        "rollout.demo": (list(rollout.demo), "a demonstration is written in grpo_exp's tags"),
        "rollout.describe_tools": (not rollout.describe_tools, "the chat template describes the tools on TRL's loop"),
    }
    for key, (given, why) in only_tags.items():
        if given:
            return f"{key} is read by grpo_exp's loop only, and {native}: {why}, or set rollout.tool_calling=tags"
    if rollout.turn_credit is TurnCredit.discounted_return:
        return (
            f"rollout.turn_credit=discounted_return needs grpo_exp's loop's turns, and {native}: use "
            "rollout.tool_calling=tags, or rollout.turn_credit=outcome"
        )
    if rollout.max_tokens_per_turn < cfg.trainer.max_completion_length:
        return (
            f"rollout.max_tokens_per_turn={rollout.max_tokens_per_turn}: {native}, which limits the whole "
            "conversation by trainer.max_completion_length, not each turn: leave it at "
            "${trainer.max_completion_length}, or set rollout.tool_calling=tags"
        )
    evaluated = [key for key in ("before", "after") if cfg.eval[key]] + (["every"] if cfg.eval.every else [])
    if evaluated:
        keys = " ".join(f"eval.{key}={'0' if key == 'every' else 'false'}" for key in evaluated)
        return (
            f"eval.{evaluated[0]}: grpo_exp's held-out evaluation plays episodes with its own loop, and {native}: "
            f"set {keys} (its held-out episodes are not evaluated on TRL's loop yet), or rollout.tool_calling=tags"
        )
    return None


def check_turn_credit(cfg: DictConfig) -> None:
    """rollout.turn_credit=discounted_return gives each turn its own advantage from the summed reward, in place of
    TRL's one per completion: it needs TRL's own estimator, aggregation and loss, which take per-token advantages."""
    credit = "rollout.turn_credit=discounted_return gives each turn of a trajectory its own advantage"
    if cfg.algorithm.name != TRL_ADVANTAGES:
        raise UserError(
            f"{credit}, from TRL's group statistics: algorithm={cfg.algorithm.name} computes its own; use "
            "algorithm=grpo, or rollout.turn_credit=outcome"
        )
    aggregation = cfg.trainer.extra.get("multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        raise UserError(
            f"{credit}, from the summed reward: trainer.extra.multi_objective_aggregation={aggregation} "
            "normalises each component first; leave it at sum_then_normalize, or rollout.turn_credit=outcome"
        )
    if not is_trls(str(cfg.trainer.loss_type)):
        raise UserError(
            f"{credit}, and trainer.loss_type={cfg.trainer.loss_type} takes one per completion: use one "
            "of TRL's loss types, or rollout.turn_credit=outcome"
        )
