"""The registries are the one source of the built-ins' names: environment schemes, reward components, estimators,
answer rules, labels, the probe's attacks, rollout tools, logger backends."""

import pytest

from grpo_exp.environments.schemes import builtin_schemes, environment_scheme, scheme_of
from tests.helpers.modules import unseen_module_name


def test_builtin_environment_schemes_are_registered_beside_their_code():
    """Each module of grpo_exp.environments that names a scheme (its PREFIX) registers its builder, and nothing else
    is registered."""
    import dataclasses
    import importlib
    import pkgutil

    import grpo_exp.environments
    from grpo_exp.environments.schemes import SETTINGS

    names = [module.name for module in pkgutil.iter_modules(grpo_exp.environments.__path__)]
    modules = [importlib.import_module(f"grpo_exp.environments.{name}") for name in names]
    declared = {module.PREFIX: module.__name__ for module in modules if hasattr(module, "PREFIX")}
    schemes = builtin_schemes()
    assert {prefix: builder.__module__ for prefix, builder in schemes.items()} == declared
    # each scheme's own settings, where it declares some, are a dataclass of its own module (the schema's section of
    # it: tests/test_environment.py)
    for prefix in schemes:
        assert scheme_of(f"{prefix}rest") == prefix
        settings = SETTINGS[prefix]
        assert settings is None or (dataclasses.is_dataclass(settings) and settings.__module__ == declared[prefix])
    assert scheme_of("my_module:MyEnv") is None


@pytest.mark.parametrize("setting", ["foo/bar", "textarena"])
def test_an_environment_neither_built_in_nor_an_import_path_lists_the_registrys_schemes(setting):
    from grpo_exp.errors import UserError
    from grpo_exp.rollout.environment import load_environments

    with pytest.raises(UserError) as refused:
        load_environments(setting, timeout=5)
    schemes = ", ".join(f"{prefix}..." for prefix in builtin_schemes())
    assert str(refused.value) == (
        f"rollout.environment={setting}: neither a built-in environment ({schemes}) nor your class by import path, "
        "module:Class"
    )


def test_a_scheme_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        environment_scheme("textarena/")(lambda rest: None)


def test_the_schema_reads_the_reward_components_from_their_registry():
    from pathlib import Path

    from grpo_exp.paths import REPO_ROOT
    from grpo_exp.rewards.components import builtin_components
    from grpo_exp.rewards.registry import COMPONENTS, REWARD_COMPONENTS

    registered = builtin_components()
    assert REWARD_COMPONENTS == {name: c.settings for name, c in registered.items()}
    assert set(COMPONENTS) == set(registered)
    # every built-in component has its YAML, conf/reward/<name>.yaml (the mixes, e.g. conf/reward/math+format, aside)
    assert set(registered) <= {p.stem for p in Path(REPO_ROOT, "conf", "reward").glob("*.yaml")}
    # each component's settings live beside its factory
    for component in registered.values():
        assert component.settings.__module__ == component.factory.__module__


def test_a_reward_component_registers_once():
    from grpo_exp.rewards.components import reward_component

    with pytest.raises(ValueError, match="already registered"):
        reward_component("math", object)(lambda: None)


def test_an_unknown_reward_component_lists_exactly_the_registrys_names():
    from omegaconf import OmegaConf

    from grpo_exp.errors import UserError
    from grpo_exp.rewards.components import builtin_components
    from grpo_exp.rewards.registry import typed_components

    with pytest.raises(UserError) as err:
        typed_components(OmegaConf.create({"components": {"nope": {"weight": 1.0}}}))
    assert "reward component 'nope' is unknown" in str(err.value)
    assert str(sorted(builtin_components())) in str(err.value)


USERS_ESTIMATORS = """
import torch

from grpo_exp.trainer.advantages import DEFAULT_SCALE_REWARDS, estimator_declares

@estimator_declares(keeps_group_scale=False, requires=())
def above_median(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    return (grouped > grouped.median(dim=1, keepdim=True).values).float().view(-1)

@estimator_declares(requires=(DEFAULT_SCALE_REWARDS,))
def centred(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)

def undeclared(rewards, group_size):
    return rewards
"""


def test_a_users_estimator_declares_what_a_builtin_does_and_the_rules_read_it(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from grpo_exp.errors import UserError
    from grpo_exp.schema import ScaleRewards
    from grpo_exp.trainer.advantages import (
        DEFAULT_SCALE_REWARDS,
        REPLACES_TRL,
        check_algorithm,
        check_keeps_group_scale,
        estimator,
    )

    module = unseen_module_name("users_estimators")
    (tmp_path / f"{module}.py").write_text(USERS_ESTIMATORS)
    monkeypatch.syspath_prepend(str(tmp_path))

    median = estimator(f"{module}:above_median")
    assert (median.keeps_group_scale, median.requires) == (False, ())
    assert estimator(f"{module}:centred").requires == (DEFAULT_SCALE_REWARDS,)
    undeclared = estimator(f"{module}:undeclared")
    assert (undeclared.keeps_group_scale, undeclared.requires) == (True, REPLACES_TRL)

    # keeps_group_scale=False: a setting that scales a group's rewards is refused with it, as with pass_at_k
    with pytest.raises(UserError, match=f"algorithm={module}:above_median cancels"):
        check_keeps_group_scale(f"{module}:above_median", ScaleRewards.none, "scale_by_pass_rate")
    check_keeps_group_scale(f"{module}:undeclared", ScaleRewards.none, "scale_by_pass_rate")
    # requires=(): TRL's scaling left as the user sets it; the default requirements refuse it
    trainer = OmegaConf.create({"scale_rewards": "batch", "num_generations": 4, "extra": {}})
    check_algorithm(OmegaConf.create({"name": f"{module}:above_median"}), trainer)
    with pytest.raises(UserError, match="trainer.scale_rewards=batch"):
        check_algorithm(OmegaConf.create({"name": f"{module}:centred"}), trainer)


def test_the_config_comments_list_exactly_the_registered_estimators():
    import re
    from pathlib import Path

    from grpo_exp.paths import REPO_ROOT
    from grpo_exp.trainer.advantages import ESTIMATORS

    line = next(
        line for line in Path(REPO_ROOT, "conf", "config.yaml").read_text().splitlines() if "- algorithm:" in line
    )
    listed = re.findall(r"(\w+)(?: \([^)]*\))?(?: \||$)", line.partition("advantage estimator:")[2].strip())
    assert listed == list(ESTIMATORS)
    assert {p.stem for p in Path(REPO_ROOT, "conf", "algorithm").glob("*.yaml")} == set(ESTIMATORS)


def test_an_unknown_estimator_lists_exactly_the_registrys_names():
    from grpo_exp.errors import UserError
    from grpo_exp.trainer.advantages import ESTIMATORS, estimator

    with pytest.raises(UserError) as err:
        estimator("nope")
    assert f"algorithm.name=nope: no such estimator; the registered ones: {', '.join(ESTIMATORS)};" in str(err.value)


def test_the_graded_components_are_those_registered_as_graded():
    from grpo_exp.rewards.components import builtin_components, graded_components

    assert graded_components() == {"judge", "confidence"}
    assert graded_components() == {name for name, c in builtin_components().items() if c.graded}


def _documented(page: str, first_cell: str) -> str:
    """The line of docs/<page> that starts with `first_cell` (a table's row)."""
    from pathlib import Path

    from grpo_exp.paths import REPO_ROOT

    return next(line for line in Path(REPO_ROOT, "docs", page).read_text().splitlines() if line.startswith(first_cell))


def test_every_answer_rule_is_documented_accepted_and_listed_when_refused():
    from pathlib import Path

    from grpo_exp.answers import AUTO, BUILT_IN, answer_rule, check_answer, user_extractor
    from grpo_exp.errors import UserError
    from grpo_exp.paths import REPO_ROOT

    table = Path(REPO_ROOT, "docs", "tasks-and-datasets.md").read_text().partition("| `verifier.answer` | reads |")[2]
    table = table.partition("\n\n")[0]
    for name in BUILT_IN:
        check_answer(name)
        assert f"`{name}`" in table, f"verifier.answer={name} is not in docs/tasks-and-datasets.md's table"
    with pytest.raises(UserError) as refused:
        user_extractor("nope")
    assert f"not a built-in ({', '.join([AUTO, *BUILT_IN])})" in str(refused.value)
    with pytest.raises(ValueError, match="already registered"):
        answer_rule("boxed")(lambda text: None)


def test_every_labels_rule_is_documented_and_listed_when_refused():
    from omegaconf import OmegaConf

    from grpo_exp.errors import UserError
    from grpo_exp.verification.labels import BUILT_IN, check_labels, labels_rule

    row = _documented("config-reference.md", "| `verifier`")
    for name in BUILT_IN:
        assert f"`{name}`" in row, f"verifier.labels={name} is not in docs/config-reference.md's verifier row"
    verifier = OmegaConf.create({"labels": "nope", "labels_batched": False})
    with pytest.raises(UserError) as refused:
        check_labels(verifier, OmegaConf.create({}))
    assert f"not a built-in ({', '.join(BUILT_IN)})" in str(refused.value)
    with pytest.raises(ValueError, match="already registered"):
        labels_rule("exact_match")(lambda extract: None)


def test_every_attack_is_in_the_battery_in_the_order_registered():
    from grpo_exp.probe.attacks import ATTACKS, RIGHT, WRONG, Problem, attack, battery, final_answer_style

    problem = Problem("Calculate 5 - 33.", "-28", "-27", final_answer_style("boxed"))
    completions = battery(problem)
    assert list(completions) == [RIGHT, WRONG, *ATTACKS]
    assert all(isinstance(text, str) for text in completions.values())
    with pytest.raises(ValueError, match="already registered"):
        attack("hedge")(lambda p: "")


def test_every_tool_is_built_under_its_name_documented_and_accepted():
    from grpo_exp.errors import UserError
    from grpo_exp.rollout.tools import TOOLS, build_tools, builtin_tool, check_tool_names
    from grpo_exp.rollout.tools.python_sandbox import SandboxLimits

    row = _documented("config-reference.md", "| `rollout`")
    check_tool_names(list(TOOLS))
    assert [tool.name for tool in build_tools(list(TOOLS), SandboxLimits())] == list(TOOLS)
    for name in TOOLS:
        assert f"`{name}`" in row.partition("rollout.tools")[2], f"rollout.tools: {name} is not in the docs' row"
    with pytest.raises(UserError) as refused:
        check_tool_names(["nope"])
    assert f"the tools are {sorted(TOOLS)}" in str(refused.value)
    with pytest.raises(ValueError, match="already registered"):
        builtin_tool("python")(lambda limits: None)


def test_every_logger_backend_but_none_is_registered_with_its_conf_option():
    from pathlib import Path

    import yaml

    from grpo_exp.paths import REPO_ROOT
    from grpo_exp.run.trackers import BACKENDS, tracker_backend
    from grpo_exp.schema import LoggerBackend

    assert set(BACKENDS) == set(LoggerBackend) - {LoggerBackend.none}
    for backend in LoggerBackend:
        option = yaml.safe_load(Path(REPO_ROOT, "conf", "logger", f"{backend.value}.yaml").read_text())
        assert option["backend"] == backend.value
    with pytest.raises(ValueError, match="already registered"):
        tracker_backend(LoggerBackend.wandb, library="wandb")(lambda: None)
