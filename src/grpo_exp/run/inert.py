"""Settings that act only given another: a value of one of them that this run would ignore is refused, naming both
keys (the resolve phase, before anything is checked further).

Each feature declares its own rules beside its code (a module-level `ONLY_WITH` of grpo_exp.config_rules.OnlyWith);
FEATURES lists those modules in the order their rules are checked: a section's switch before the options inside it,
the model and the data before what reads them. tests/test_config_rules.py finds every module that declares rules and
checks that it is listed here.
"""

import importlib

from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.config_rules.given import Written, leaves, shown
from grpo_exp.errors import UserError

FEATURES = (
    "grpo_exp.models",
    "grpo_exp.data",
    "grpo_exp.rewards.judge",
    "grpo_exp.verification.p_yes",
    "grpo_exp.rewards.selfverify",
    "grpo_exp.trainer.zero_variance",
    "grpo_exp.trainer.config",
    "grpo_exp.trainer.mismatch",
    "grpo_exp.trainer.vllm_engine",
    "grpo_exp.trainer.async_generation",
    "grpo_exp.rollout.multiturn",
    "grpo_exp.rollout.environment",
    "grpo_exp.environments.textarena",
    "grpo_exp.trainer.turn_credit",
    "grpo_exp.rollout.turn_cache",
    "grpo_exp.rollout.tools.python_sandbox",
    "grpo_exp.rollout.tools.user",
    "grpo_exp.run.validation",
    "grpo_exp.run.health",
    "grpo_exp.probe.battery",
    "grpo_exp.run.labels_check",
    "grpo_exp.trainer.curriculum",
    "grpo_exp.task_levels",
    "grpo_exp.verification.benchmark",
    "grpo_exp.trainer.trainer",
    "grpo_exp.run.trackers",
    "grpo_exp.run.warmup.rules",
)


def only_with_rules() -> list[OnlyWith]:
    """Every feature's rules, in FEATURES' order."""
    return [rule for module in FEATURES for rule in importlib.import_module(module).ONLY_WITH]


def check_only_with(cfg: DictConfig, read_by_caller: tuple[str, ...] = ()) -> None:
    """Every feature's rules, in order: the first option given a value that this run ignores is one UserError naming
    it, what would read it, and the setting of this run that turns it off. `read_by_caller`: the sections the command
    itself reads or replaces whatever the rest says (grpo_exp.evaluate: `model.`, a checkpoint in place of the run's
    model; grpo-exp probe: `probe.`), whose rules are then not checked."""
    written = Written(cfg)
    for rule in only_with_rules():
        if rule.keys[0].startswith(read_by_caller):
            continue
        found = [leaf for key in rule.keys for leaf in leaves(cfg, key) if leaf not in rule.but]
        given = [leaf for leaf in found if written.given(leaf)]
        if given and not rule.active(cfg):
            raise UserError(rule.refusal(given[0], shown(written.value(given[0]), given[0]), cfg))
