"""Imports point one way, the top-level modules included. From the bottom:
- the foundation: the top-level modules that are not commands (schema, models, data, stats...) and config_rules;
- the parts (rewards, verification, rollouts, environments, the probe) and the after-the-run analysis;
- the trainer; the run's lifecycle (run);
- the commands (train, evaluate, compare, diagnose, probe, serve, cli), which import no other command.
Every import of every module, a function's own included, read from the source."""

import ast
from pathlib import Path

import pytest

from grpo_exp.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "grpo_exp"
COMMANDS = ("train", "evaluate", "compare", "diagnose", "reward_probe", "serve", "cli")
PACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
FOUNDATION_PACKAGES = ("config_rules",)
PARTS = ("verification", "rewards", "rollout", "environments", "probe", "analysis")
# layer -> what it must never import (a module's name under grpo_exp: a package, a top-level module)
ABOVE = {name: ("trainer", "run", *COMMANDS) for name in PARTS}
ABOVE["trainer"] = ("run", *COMMANDS)
ABOVE["run"] = COMMANDS
FOUNDATION_MUST_NOT = tuple(p for p in PACKAGES if p not in FOUNDATION_PACKAGES) + COMMANDS


def imported_modules(path: Path) -> set[str]:
    """The grpo_exp modules a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "grpo_exp"}


def upward_imports(paths: list[Path], forbidden: tuple[str, ...], allowed_self: str | None = None) -> list[str]:
    upward = []
    for path in paths:
        for module in imported_modules(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] in forbidden and parts[1] != allowed_self:
                upward.append(f"{path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path} imports {module}")
    return upward


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_a_package_never_imports_the_layers_above_it(package):
    assert not upward_imports(sorted((PACKAGE / package).rglob("*.py")), ABOVE[package]), package


def test_the_foundation_imports_no_package_and_no_command():
    modules = [p for p in sorted(PACKAGE.glob("*.py")) if p.stem not in COMMANDS]
    modules += [p for name in FOUNDATION_PACKAGES for p in sorted((PACKAGE / name).rglob("*.py"))]
    assert not upward_imports(modules, FOUNDATION_MUST_NOT)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_imports_no_other_command(command):
    assert not upward_imports([PACKAGE / f"{command}.py"], COMMANDS, allowed_self=command)


def test_every_top_level_module_and_package_has_a_layer():
    top_level = {p.stem for p in PACKAGE.glob("*.py")} | set(PACKAGES)
    layered = set(COMMANDS) | set(ABOVE) | set(FOUNDATION_PACKAGES)
    foundation = {p.stem for p in PACKAGE.glob("*.py")} - set(COMMANDS)
    assert top_level == layered | foundation


def test_the_rule_sees_an_import_inside_a_function(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("def f():\n    from grpo_exp.run.resolve import resolve\n    import grpo_exp.trainer.seam\n")
    assert imported_modules(source) == {"grpo_exp.run.resolve", "grpo_exp.trainer.seam"}
    assert upward_imports([source], ("run",)) == [f"{source} imports grpo_exp.run.resolve"]
