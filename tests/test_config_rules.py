"""Each feature declares the rules of its settings beside its code (grpo_exp.config_rules); the check
(grpo_exp.run.inert) reads every feature that declares any."""

import ast
import dataclasses

import pytest

from grpo_exp.paths import REPO_ROOT
from grpo_exp.run.config_store import run_schema
from grpo_exp.run.inert import FEATURES, only_with_rules

PACKAGE = REPO_ROOT / "src" / "grpo_exp"


def declaring_modules() -> set[str]:
    """The modules of src/ that assign a module-level ONLY_WITH, read from the source."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(getattr(target, "id", None) == "ONLY_WITH" for target in targets):
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_every_module_declaring_rules_is_checked():
    assert declaring_modules() == set(FEATURES)


def _schema_keys() -> set[str]:
    """Every section and option of the run's schema, dotted (reward components' settings aside; environment schemes'
    own settings included: rollout.textarena...)."""
    keys = set()

    def walk(schema: type, prefix: str) -> None:
        for field in dataclasses.fields(schema):
            key = f"{prefix}{field.name}"
            keys.add(key)
            kind = field.type if isinstance(field.type, type) else None
            if kind is not None and dataclasses.is_dataclass(kind):
                walk(kind, f"{key}.")

    walk(run_schema(), "")
    return keys


@pytest.mark.parametrize("rule", only_with_rules(), ids=lambda rule: rule.keys[0])
def test_a_rule_names_settings_that_exist(rule):
    """A misspelt key would never be found given, and its rule never refuse anything."""
    known = _schema_keys()
    for key in (*rule.keys, *rule.but):
        if key.startswith("reward.components.") or key.startswith("trainer.extra."):
            continue  # a component's own settings, TRL's pass-through fields: typed elsewhere
        assert key in known, f"{key} is not a setting of the schema"
