"""Composition of every option of every config group, reward mixes, and typed validation."""

import itertools

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ValidationError

from grpo_exp.paths import CONF_DIR, experiment_presets, reward_components
from grpo_exp.rewards.registry import COMPONENTS
from grpo_exp.schema import DataSource, FormatStyle, ModelSource
from support.config import compose_config

GROUPS = ["model", "dataset", "reward", "scorer", "trainer", "rollout", "logger"]
# Options that need a value from the user.
REQUIRED = {
    ("model", "pretrained"): ["model.name_or_path=some/model"],
    ("dataset", "files"): ["dataset.path=x.jsonl"],
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = compose_config([f"{group}={option}", *REQUIRED.get((group, option), [])])
    node = cfg[group]
    assert node is not None
    if group in ("model", "dataset"):
        assert node.name == option
    if group == "reward":
        assert list(node.components) == [option]


def test_defaults_are_the_embedded_model_and_offline_arithmetic():
    cfg = compose_config()
    assert cfg.model.source is ModelSource.embedded
    assert cfg.dataset.source is DataSource.reasoning_gym
    assert list(cfg.reward.components) == ["math"]
    assert cfg.trainer.loss_type == "dapo"


@pytest.mark.parametrize("mix", ["+".join(p) for p in itertools.permutations(["math", "format", "length"], 2)])
def test_any_mix_of_two_components_composes_in_order(mix):
    cfg = compose_config([f"reward={mix}"])
    assert list(cfg.reward.components) == mix.split("+")


def test_mix_of_all_components_and_weight_override():
    mix = "+".join(reward_components())
    cfg = compose_config([f"reward={mix}", "reward.components.math.weight=2.5"])
    assert list(cfg.reward.components) == mix.split("+")
    assert cfg.reward.components.math.weight == 2.5
    assert cfg.reward.components.format.style is FormatStyle.boxed


@pytest.mark.parametrize("mix,message", [("math+nope", "nope"), ("math+math", "repeated")])
def test_bad_mix_names_the_known_components(mix, message):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config([f"reward={mix}"])
    assert message in str(err.value) and "known components: confidence, correct, environment, format" in str(err.value)


def test_unknown_option_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as err:
        compose_config(["model=nope"])
    assert "smollm2_135m" in str(err.value.options) or "smollm2_135m" in str(err.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.beta=abc", "trainer.beta"),
        ("trainer.scale_rewards=foo", "trainer.scale_rewards"),
        ("model.dtype=int3", "model.dtype"),
        ("trainer.num_generations=four", "trainer.num_generations"),
    ],
)
def test_wrong_types_fail_at_composition_naming_the_key(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config([override])
    cause = err.value.__cause__
    assert isinstance(cause, ValidationError)
    assert cause.full_key == key


def test_enum_error_lists_allowed_values():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["trainer.scale_rewards=foo"])
    assert "group" in str(err.value.__cause__) and "batch" in str(err.value.__cause__)


def test_every_reward_file_has_an_implementation_and_back():
    files = set(reward_components())
    assert files == set(COMPONENTS)


@pytest.mark.parametrize("preset", experiment_presets())
def test_every_experiment_preset_composes(preset):
    cfg = compose_config([f"+experiment={preset}"])
    assert cfg.model.name and cfg.reward.components


def test_smoke_preset_overrides_groups():
    cfg = compose_config(["+experiment=smoke"])
    assert cfg.model.source is ModelSource.tiny
    assert list(cfg.reward.components) == ["math", "format", "length"]
    assert cfg.dataset.eval_size == 4
