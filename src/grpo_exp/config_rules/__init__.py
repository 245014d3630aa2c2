"""Settings' rules, declared by each feature beside its code.

A feature module whose settings act only given another declares them in a module-level `ONLY_WITH` tuple of
`OnlyWith` rules (grpo_exp.run.inert checks every feature's, before the run is built): a value of such a setting that
the run would ignore is refused, naming both keys. A section (`judge`) stands for every option under it, but those in
`but`. What counts as a value the user gave (not the schema's default, nor a value a conf/ option gives it):
grpo_exp.config_rules.given.
"""

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig


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

    def refusal(self, key: str, shown_value: str, cfg: DictConfig) -> str:
        """The message refusing `key`'s value where the rule is not active."""
        fix = self.fix(cfg) if callable(self.fix) else self.fix
        return f"{key}={shown_value} is read only {self.when}, but {self.here(cfg)}: {fix}, or leave {key} out"


def mix(cfg: DictConfig) -> list[str]:
    """The reward mix's components, by name (rules of the parts a component brings)."""
    return list(cfg.reward.components)
