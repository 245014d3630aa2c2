"""A resolved run spec -> the cheap objects of a run, each built once and handed to whoever needs it: the
correctness labels (verifier.labels) with the answer extractor (verifier.answer), the P(Yes) scorer, the judge, the
reward functions, the multi-turn rollout and the self-verification task. Nothing is checked here:
grpo_exp.run.resolve has checked everything that can be, and no model loads yet. A component's task of its own (the
self-verification task) is built from what its registration declares (grpo_exp.rewards.components.Task)."""

import os
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from grpo_exp.rewards.judge import RubricJudge, build_judge
from grpo_exp.rewards.registry import build_rewards, build_tasks, shared_needs
from grpo_exp.rollout.multiturn import MultiTurnRollout, scored_on_final_turn
from grpo_exp.rollout.native import Guards, environment_factories
from grpo_exp.run.resolve import RunSpec
from grpo_exp.schema import ScorerName, ScorerSchema
from grpo_exp.verification.labels import Labels, build_labels
from grpo_exp.verification.p_yes import PYesScorer, build_p_yes


@dataclass
class RunParts:
    reward_funcs: list
    reward_weights: list[float]
    verifier: Labels  # the correctness labels (verifier.labels) and answer extractor (verifier.answer), read by all
    p_yes: PYesScorer | None  # the one P(Yes) scorer (confidence reward and self-verification metrics)
    judge: RubricJudge | None  # the one LLM judge (judge reward and held-out judge statistics)
    rollout: MultiTurnRollout | None  # None for rollout=single
    # rollout.tool_calling=native: TRL's environment_factory (grpo_exp.rollout.native), in place of the rollout's loop
    environment_factory: object = None
    # the tasks of their own that components bring the trainer (Component.task), by component name
    tasks: dict[str, object] = field(default_factory=dict)

    def bind_policy(self, model, tokenizer) -> None:
        """Point a P(Yes) scorer that follows the policy (scorer=self) at the live, trained weights."""
        if self.p_yes is not None and self.p_yes.follows_policy:
            self.p_yes.bind(model, tokenizer)


def build_parts(spec: RunSpec, references: list) -> RunParts:
    """`references`: the training set's answers (verifier.answer=auto reads them to choose its rule)."""
    cfg = spec.cfg
    verifier = build_labels(cfg.verifier, [str(r) for r in references if r is not None])
    p_yes = p_yes_scorer(spec)
    judge = build_judge(cfg.judge, cfg.cache_dir) if "judge" in shared_needs(spec.components) else None
    limit = cfg.trainer.max_completion_length
    shared = {"p_yes": p_yes, "judge": judge, "verifier": verifier, "max_completion_length": limit}
    rollout = build_rollout(spec)
    factory = None
    if spec.native_tool_calling:  # TRL's loop runs the environments, each method guarded (grpo_exp.rollout.native)
        rollout_cfg = cfg.rollout
        guards = Guards(
            rollout_cfg.environment_timeout_s,
            rollout_cfg.environment_success_at,
            rollout_cfg.max_observation_chars,
            rollout.budget,
        )
        factory = environment_factories(rollout.environments, guards)
    reward_funcs = build_rewards(spec.components, shared)
    if rollout is not None and not spec.native_tool_calling:
        reward_funcs = [scored_on_final_turn(func) for func in reward_funcs]
    tasks = build_tasks(spec.components, {**shared, "seed": cfg.trainer.seed})
    return RunParts(reward_funcs, spec.reward_weights, verifier, p_yes, judge, rollout, factory, tasks)


def p_yes_scorer(spec: RunSpec) -> PYesScorer | None:
    """One scorer for everything that needs a P(Yes): the `confidence` reward takes the configured generative
    verifier's (scorer=genrm | self); the self-verification metrics take it too, or the policy's own with
    scorer=none. None
    when nothing needs one."""
    if not spec.needs_p_yes:
        return None
    cfg = spec.cfg
    scorer = build_p_yes(cfg.scorer, cfg.model, cfg.cache_dir)
    if scorer is not None:
        return scorer
    return PYesScorer(OmegaConf.structured(ScorerSchema(name=ScorerName.self)), cfg.model, cfg.cache_dir)


def build_rollout(spec: RunSpec) -> MultiTurnRollout | None:
    if not spec.multiturn:
        return None
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL: we know
    return MultiTurnRollout(spec.cfg.rollout)
