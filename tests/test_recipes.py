"""Published recipes as presets (conf/recipe): each reaches TRL's GRPOConfig with what its paper sets, cites the
paper and says what it leaves out; the command line still wins; each trains."""

import json
import re
from pathlib import Path

import pytest

from grpo_exp.errors import UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.run.resolve import resolve
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli

RECIPES = ("grpo", "dr_grpo", "dapo", "gspo", "rloo")

# What each paper sets, as TRL's GRPOConfig receives it (and the estimator grpo_exp applies).
PUBLISHED = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "beta": 0.04, "epsilon": 0.2, "estimator": "grpo"},
    "dr_grpo": {"loss_type": "dr_grpo", "beta": 0.0, "estimator": "dr_grpo"},
    "dapo": {
        "loss_type": "dapo",
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "zero_variance_groups": "resample",
        "estimator": "grpo",
    },
    "gspo": {
        "loss_type": "grpo",
        "beta": 0.0,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "importance_sampling_level": "sequence",
        "estimator": "grpo",
    },
    "rloo": {"loss_type": "grpo", "beta": 0.0, "estimator": "rloo"},
}


def grpo_config(overrides: list[str]):
    return resolve(compose_config([*TINY_RUN, "logger=none", *overrides]), processes=1, trainer_dir=Path("unused")).args


def value(args, key):
    found = args.advantage_estimator if key == "estimator" else getattr(args, key)
    return getattr(found, "value", found)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_reaches_trl_with_what_its_paper_sets(recipe):
    args = grpo_config([f"recipe={recipe}"])
    assert {key: value(args, key) for key in PUBLISHED[recipe]} == PUBLISHED[recipe]


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_cites_its_paper_and_says_what_it_leaves_out(recipe):
    text = (CONF_DIR / "recipe" / f"{recipe}.yaml").read_text()
    assert re.search(r"arXiv \d{4}\.\d{5}", text) and "Leaves out:" in text


def test_dapo_mixes_its_soft_overlong_punishment_into_any_reward():
    """The paper's eq. 13 over the last fifth of the completion limit, beside whatever reward the user chose; a
    penalty zone longer than the limit is refused at resolve, naming both keys."""
    base = [*TINY_RUN, "logger=none", "recipe=dapo"]
    spec = resolve(compose_config([*base, "reward=math+format"]), processes=1)
    assert list(spec.components) == ["math", "format", "overlong"]
    assert spec.components["overlong"].weight == 1.0 and spec.components["overlong"].cache_tokens is None
    too_long = [*base, f"reward.components.overlong.cache_tokens={spec.cfg.trainer.max_completion_length + 1}"]
    with pytest.raises(UserError, match=r"reward.components.overlong.cache_tokens=\d+ is longer than trainer.max_"):
        resolve(compose_config(too_long), processes=1)


def test_the_command_line_wins_over_a_recipe():
    args = grpo_config(["recipe=grpo", "trainer.beta=0.1", "algorithm=rloo", "trainer.scale_rewards=group"])
    assert args.beta == 0.1 and args.advantage_estimator == "rloo"
    assert grpo_config(["recipe=none"]).loss_type == "dapo", "no recipe: grpo_exp's own defaults"


@pytest.mark.e2e
def test_every_recipe_trains_in_one_sweep(tmp_path):
    result = run_cli(
        "-m",
        *TINY_RUN,
        "trainer.max_steps=1",
        "logger=none",
        "eval.before=false",
        "eval.after=false",
        f"recipe={','.join(RECIPES)}",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job, recipe in enumerate(RECIPES):
        summary = json.loads((tmp_path / str(job) / "summary.json").read_text())
        assert summary["steps"] == 1 and summary["algorithm"] == PUBLISHED[recipe]["estimator"]
