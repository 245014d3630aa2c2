"""Config -> the cheap objects of a run: reward functions and weights, the verifier, the P(Yes) scorer, the
self-verification task and the multi-turn rollout. Everything in the config that can be wrong fails here,
before any model loads; every object is built once and handed to whoever needs it."""

import os
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from grpo_exp.data import check_data_files
from grpo_exp.errors import UserError
from grpo_exp.models import check_reachable
from grpo_exp.rewards.judge import RubricJudge, build_judge
from grpo_exp.rewards.registry import build_rewards
from grpo_exp.rollout.multiturn import MultiTurnRollout, scored_on_final_turn
from grpo_exp.run.distributed import world_size
from grpo_exp.schema import RolloutName, VerifierName, VerifierSchema, check_values
from grpo_exp.trainer.config import check_trainer
from grpo_exp.verification.p_yes import PYesScorer, build_p_yes
from grpo_exp.verification.rule import Verifier, math_verify_verifier
from grpo_exp.verification.task import SelfVerificationTask, check_task


@dataclass
class RunParts:
    reward_funcs: list
    reward_weights: list[float]
    verifier: Verifier  # the rule verifier: ground-truth labels
    p_yes: PYesScorer | None  # the one P(Yes) scorer (confidence reward and self-verification metrics)
    judge: RubricJudge | None  # the one LLM judge (judge reward and held-out judge statistics)
    selfverify: SelfVerificationTask | None
    rollout: MultiTurnRollout | None  # None for rollout=single

    def bind_policy(self, model, tokenizer) -> None:
        """Point a P(Yes) scorer that follows the policy (verifier=self) at the live, trained weights."""
        if self.p_yes is not None and self.p_yes.follows_policy:
            self.p_yes.bind(model, tokenizer)


def check_and_build(cfg: DictConfig) -> RunParts:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"required value(s) not set: {', '.join(missing)} (add e.g. {missing[0]}=...)")
    check_values(cfg)
    components = cfg.reward.components
    p_yes = p_yes_scorer(cfg)
    judge = build_judge(cfg.judge, cfg.cache_dir) if "judge" in components else None
    reward_funcs, reward_weights = build_rewards(cfg.reward, {"p_yes": p_yes, "judge": judge})
    verifier = math_verify_verifier()
    check_trainer(cfg.trainer, world_size())
    rollout = build_rollout(cfg)
    if rollout is not None:
        reward_funcs = [scored_on_final_turn(func) for func in reward_funcs]
    task_cfg = components.get("selfverify")
    if task_cfg is not None:
        check_task(task_cfg, cfg.trainer)
    selfverify = None if task_cfg is None else SelfVerificationTask(task_cfg, verifier, p_yes, cfg.trainer.seed)
    check_data_files(cfg.dataset)
    check_reachable(cfg.model)
    return RunParts(reward_funcs, reward_weights, verifier, p_yes, judge, selfverify, rollout)


def p_yes_scorer(cfg: DictConfig) -> PYesScorer | None:
    """One scorer for everything that needs a P(Yes): the `confidence` reward takes the configured generative
    verifier's; the self-verification metrics take it too, or the policy's own with the rule verifier. None
    when nothing needs one."""
    components = cfg.reward.components
    if "confidence" not in components and "selfverify" not in components:
        return None
    scorer = build_p_yes(cfg.verifier, cfg.model, cfg.cache_dir)
    if scorer is not None:
        return scorer
    if "confidence" in components:
        raise UserError(
            "reward component 'confidence' needs a probability of correctness: use verifier=genrm (a frozen "
            "verifier) or verifier=self (the policy); verifier=math_verify only gives labels"
        )
    return PYesScorer(OmegaConf.structured(VerifierSchema(name=VerifierName.self)), cfg.model, cfg.cache_dir)


def build_rollout(cfg: DictConfig) -> MultiTurnRollout | None:
    if cfg.rollout.name is RolloutName.single:
        return None
    if "selfverify" in cfg.reward.components:
        raise UserError("reward=...selfverify with rollout=multiturn is not supported: use rollout=single")
    if cfg.trainer.extra.get("use_vllm"):
        raise UserError("rollout=multiturn generates with transformers; use generation=transformers")
    for option in ("bfloat16_generation", "fast_generation"):
        if cfg.trainer[option]:
            raise UserError(
                f"rollout=multiturn generates its turns itself (trainer.{option} is not used there); "
                "use generation=transformers"
            )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL: we know
    return MultiTurnRollout(cfg.rollout)
