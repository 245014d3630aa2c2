"""docs/adding-a-builtin.md, followed as written: its reward component `brevity` (its module, with a check against the
run and a setting read only given another, and its YAML), and its environment scheme `gridworld` with a setting of its
own (its module), both added to a copy of the run in one fresh process, then refused and accepted as the page says.
The registries are that process's own: nothing registered here reaches other tests."""

import json
import re
import subprocess
import sys

import pytest

from grpo_exp.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "adding-a-builtin.md"
pytestmark = pytest.mark.xdist_group("adding_a_builtin")  # one worker, one process for both tests (`followed`)

# In a fresh process: grpo_exp.rewards and grpo_exp.environments searched in the temporary directory too (every module
# of a package is imported when its registry is read), the new modules listed among the features that declare rules
# (the page's step), and each case's config composed with the temporary config directory, then resolved.
FOLLOW_THE_PAGE = """
import json, sys
tmp, features, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
import grpo_exp.environments, grpo_exp.rewards
grpo_exp.rewards.__path__.append(f"{tmp}/rewards")
grpo_exp.environments.__path__.append(f"{tmp}/environments")
from grpo_exp.run import inert
inert.FEATURES = (*inert.FEATURES, *features)
from grpo_exp.errors import UserError
from grpo_exp.run.config_store import register_schemas
from grpo_exp.run.resolve import resolve
from grpo_exp.run.sources import compose_with
from support.config import TINY_RUN
register_schemas()
results = {}
for name, overrides in cases.items():
    cfg = compose_with([("command-line", f"file://{tmp}/conf")], [*TINY_RUN, *overrides])
    try:
        resolve(cfg, processes=1)
        results[name] = "accepted"
    except UserError as err:
        results[name] = str(err)
print(json.dumps(results))
from grpo_exp.process_exit import leave
leave(0)  # as a command ends: not the interpreter's teardown of the model libraries (seconds)
"""

BREVITY = "reward.components.brevity"
REWARD_CASES = {  # each with the page's mix: reward=math+brevity, trainer.max_completion_length=128
    "defaults": [],
    "out of bounds": [f"{BREVITY}.max_words=0"],
    "past the completion": [f"{BREVITY}.max_words=5000"],
    "slack while strict": [f"{BREVITY}.slack=5"],
    "slack with partial credit": [f"{BREVITY}.slack=5", f"{BREVITY}.strict=false"],
}
PLAYS = ["rollout=environment", "rollout.environment=gridworld/5", "reward=environment"]
ENVIRONMENT_CASES = {
    "defaults": PLAYS,
    "a good value": [*PLAYS, "rollout.gridworld.max_moves=8"],
    "out of bounds": [*PLAYS, "rollout.gridworld.max_moves=0"],
    "no grid world": ["rollout=multiturn", "rollout.tools=[calculator]", "rollout.gridworld.max_moves=8"],
    "a bad size": ["rollout=environment", "rollout.environment=gridworld/five", "reward=environment"],
}


def code_block(page: str, language: str, opening: str) -> str:
    """The page's `language` code block whose text starts with `opening`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", page, flags=re.DOTALL)
    (found,) = [block for block in blocks if block.startswith(opening)]
    return found


@pytest.fixture(scope="module")
def followed(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The page's reward component and environment scheme, both added as it says, every case of each resolved in one
    fresh process (its start, the model libraries' imports, is most of its time): "accepted", or the refusal's
    message, by case, under "reward" and "environment"."""
    page = PAGE.read_text(encoding="utf-8")
    tmp = tmp_path_factory.mktemp("builtin")
    (tmp / "rewards").mkdir()
    (tmp / "rewards" / "brevity.py").write_text(
        code_block(page, "python", '"""Brevity: 1 for a completion of at most max_words words; past it')
    )
    (tmp / "conf" / "reward").mkdir(parents=True)
    (tmp / "conf" / "reward" / "brevity.yaml").write_text(code_block(page, "yaml", "# Brevity:"))
    (tmp / "environments").mkdir()
    (tmp / "environments" / "gridworld.py").write_text(
        code_block(page, "python", '"""A grid to walk to its corner in at most max_moves moves')
    )
    mix = ["reward=math+brevity", "trainer.max_completion_length=128"]
    cases = {f"reward: {name}": [*mix, *overrides] for name, overrides in REWARD_CASES.items()}
    cases |= {f"environment: {name}": overrides for name, overrides in ENVIRONMENT_CASES.items()}
    features = ["grpo_exp.rewards.brevity", "grpo_exp.environments.gridworld"]
    ran = subprocess.run(
        [sys.executable, "-c", FOLLOW_THE_PAGE, str(tmp), json.dumps(features), json.dumps(cases)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads(ran.stdout.strip().splitlines()[-1])
    return {
        kind: {name.removeprefix(f"{kind}: "): result for name, result in results.items() if name.startswith(kind)}
        for kind in ("reward", "environment")
    }


def test_the_pages_reward_component_is_refused_and_accepted_as_the_page_says(followed):
    results, key = followed["reward"], BREVITY
    assert results["defaults"] == "accepted" and results["slack with partial credit"] == "accepted", results
    assert results["out of bounds"].startswith(f"{key}.max_words=0")
    assert results["past the completion"].startswith(f"{key}.max_words=5000 is more words than")
    assert results["slack while strict"] == (
        f"{key}.slack=5 is read only with partial credit past max_words ({key}.strict=false), but {key}.strict=true "
        f"pays 0 past max_words: set {key}.strict=false too, or leave {key}.slack out"
    )


def test_the_pages_environment_scheme_with_a_setting_of_its_own_is_refused_and_accepted_as_the_page_says(followed):
    results = followed["environment"]
    assert results["defaults"] == "accepted" and results["a good value"] == "accepted", results
    assert results["out of bounds"] == "rollout.gridworld.max_moves=0 must be at least 1"
    assert results["no grid world"] == (
        "rollout.gridworld.max_moves=8 is read only by the grid world (rollout.environment=gridworld/<size>), but "
        "rollout.environment=None plays no grid world: set rollout.environment=gridworld/<size>, or leave "
        "rollout.gridworld.max_moves out"
    )
    assert results["a bad size"].startswith("rollout.environment=gridworld/five: the size is a whole number")
