"""Resolve: the composed config -> the typed run spec, every check of a run made here, once, before anything is built.

The checks run in this order, each raising one UserError that names the key the user typed:
1. values the user must set, then every value's bounds (the schema's knob metadata);
2. the reward components on their typed schemas (the mix's own settings and weights; a component of the user's
   own: its import path and signature, grpo_exp.rewards.custom);
3. the rules between fields: the verifier a component needs, the judge's settings, the trainer's knobs (batch
   split, zero-variance groups, the sampling copy, pass-through GRPOConfig fields), the advantage estimator
   (algorithm.*) against them, the rollout, the
   self-verification task against the trainer;
4. the world outside: data files, models and tokenizers named anywhere (local directory or hub), the checkpoint
   to resume from;
5. for training, TRL's own config (GRPOExpConfig) with GRPOConfig's own checks of the pass-through fields.
Build (grpo_exp.run.build) then goes down the floors once, from the spec, and checks nothing. What needs a loaded
tokenizer or model (a chat template, single-token verdicts or scores, a prepacked copy's probe) is checked where
that object is loaded.
"""

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_exp.data import check_data_files
from grpo_exp.errors import UserError
from grpo_exp.models import check_reachable, torch_dtype, trained_dtype
from grpo_exp.rewards import GRADED_COMPONENTS
from grpo_exp.rewards.judge import check_judge
from grpo_exp.rewards.registry import reward_weights, typed_components
from grpo_exp.rewards.rubric import load_rubric_file
from grpo_exp.rollout.tools import check_tool_names
from grpo_exp.run.distributed import world_size
from grpo_exp.run.resume import Attempt, resolve_attempt
from grpo_exp.run.tracking import redact, report_to
from grpo_exp.run.validation import check_validation
from grpo_exp.schema import RolloutName, VerifierName, check_values
from grpo_exp.trainer.advantages import check_algorithm
from grpo_exp.trainer.config import GRPOExpConfig, check_trainer, grpo_exp_config
from grpo_exp.verification.labels import check_labels
from grpo_exp.verification.p_yes import check_verifier_reachable
from grpo_exp.verification.task import check_task


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

    @property
    def reward_weights(self) -> list[float]:
        return reward_weights(self.components)

    @property
    def eval_max_new_tokens(self) -> int:
        """Held-out answers are as long as training completions unless eval.max_new_tokens says otherwise."""
        return self.cfg.eval.max_new_tokens or self.cfg.trainer.max_completion_length

    @property
    def selfverify(self) -> DictConfig | None:
        return self.components.get("selfverify")

    @property
    def multiturn(self) -> bool:
        return self.cfg.rollout.name is RolloutName.multiturn

    @property
    def needs_p_yes(self) -> bool:
        """The confidence reward and the self-verification metrics read a P(Yes)."""
        return "confidence" in self.components or "selfverify" in self.components


def resolve(cfg: DictConfig, processes: int | None = None, trainer_dir: Path | None = None) -> RunSpec:
    """`processes`: how many processes train together (default: this launch's); `trainer_dir`: where the trainer
    writes its checkpoints, for a training run (its GRPOExpConfig is made and checked too)."""
    check_required(cfg)
    load_rubric_file(cfg.judge)  # judge.rubric_file: its rubric replaces judge.rubric, recorded in the run's config
    check_values(cfg)
    components = typed_components(cfg.reward)
    saved_config = redact(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    spec = RunSpec(
        cfg=cfg,
        components=components,
        processes=world_size() if processes is None else processes,
        # training: the weights' dtype (float32 master weights under bfloat16 compute); evaluation: model.dtype
        policy_dtype=torch_dtype(cfg.model.dtype) if trainer_dir is None else trained_dtype(cfg.model),
        saved_config=saved_config,
    )
    check_verifier(spec)
    if "judge" in spec.components:
        check_judge(cfg.judge, spec.processes)
    check_trainer(cfg.trainer, spec.processes, multiturn=spec.multiturn, policy_dtype=spec.policy_dtype)
    check_algorithm(cfg.algorithm, cfg.trainer)
    check_rollout(spec)
    if spec.selfverify is not None:
        check_task(spec.selfverify, cfg.trainer, cfg.algorithm)
    check_validation(cfg.eval, cfg.trainer, tuple(name for name in spec.components if name in GRADED_COMPONENTS))
    check_data_files(cfg.dataset)
    check_reachable(cfg.model)
    attempt = resolve_attempt(cfg.trainer.resume, Path(cfg.outputs_dir), saved_config)
    args = None
    if trainer_dir is not None:
        bf16 = torch_dtype(cfg.model.dtype) == torch.bfloat16  # bfloat16 compute: autocast (mixed precision)
        args = grpo_exp_config(
            cfg.trainer, trainer_dir, report_to(cfg.logger), spec.reward_weights, bf16, spec.processes, cfg.algorithm
        )
    OmegaConf.set_readonly(cfg, True)  # what was checked is what runs
    return replace(spec, attempt=attempt, args=args)


def check_required(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"required value(s) not set: {', '.join(missing)} (add e.g. {missing[0]}=...)")


def check_verifier(spec: RunSpec) -> None:
    """The correctness labels (verifier.labels: a built-in, or the user's function by import path, its signature);
    the confidence reward needs a probability of correctness; a frozen verifier named by path must exist."""
    verifier = spec.cfg.verifier
    check_labels(verifier)
    if "confidence" in spec.components and verifier.name is VerifierName.math_verify:
        raise UserError(
            "reward component 'confidence' needs a probability of correctness: use verifier=genrm (a frozen "
            "verifier) or verifier=self (the policy); verifier=math_verify only gives labels"
        )
    if spec.needs_p_yes:
        check_verifier_reachable(verifier, spec.cfg.model, spec.processes)


def check_rollout(spec: RunSpec) -> None:
    """rollout=multiturn generates its turns itself, with the tools named (the sampling copy's rules: the trainer)."""
    if not spec.multiturn:
        return
    if spec.selfverify is not None:
        raise UserError("reward=...selfverify with rollout=multiturn is not supported: use rollout=single")
    if spec.cfg.trainer.extra.get("use_vllm"):
        raise UserError("rollout=multiturn generates with transformers; use generation=transformers")
    check_tool_names(list(spec.cfg.rollout.tools))
