"""Imports point one way: the parts (rewards, verification, rollouts, environments, the probe) below the trainer, the
trainer below the run. Every import of every module, a function's own included, read from the source."""

import ast
from pathlib import Path

import pytest

from grpo_exp.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "grpo_exp"
# package -> the packages it must never import
BELOW = {
    "verification": ("trainer", "run"),
    "rewards": ("trainer", "run"),
    "rollout": ("trainer", "run"),
    "environments": ("trainer", "run"),
    "probe": ("trainer", "run"),
    "trainer": ("run",),
}


def imported_modules(path: Path) -> set[str]:
    """The grpo_exp modules a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "grpo_exp"}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_package_never_imports_the_layers_above_it(package):
    upward = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] in BELOW[package]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not upward, upward


def test_the_rule_sees_an_import_inside_a_function(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("def f():\n    from grpo_exp.run.resolve import resolve\n    import grpo_exp.trainer.seam\n")
    assert imported_modules(source) == {"grpo_exp.run.resolve", "grpo_exp.trainer.seam"}
