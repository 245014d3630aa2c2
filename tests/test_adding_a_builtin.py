"""docs/adding-a-builtin.md, followed as written: its reward component `brevity` (its module, with a check against the
run and a setting read only given another, and its YAML), and its environment scheme `gridworld` with a setting of its
own (its module), each added to a copy of the run in a fresh process, then refused and accepted as the page says. The
registries are the process's own: nothing registered here reaches other tests."""

import json
import re
import subprocess
import sys

from grpo_exp.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "adding-a-builtin.md"

# In a fresh process: grpo_exp.rewards and grpo_exp.environments searched in the temporary directory too (every module
# of a package is imported when its registry is read), the new module listed among the features that declare rules
# (the page's step), and each case's config composed with the temporary config directory, then resolved.
FOLLOW_THE_PAGE = """
import json, sys
tmp, feature, common, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
import grpo_exp.environments, grpo_exp.rewards
grpo_exp.rewards.__path__.append(f"{tmp}/rewards")
grpo_exp.environments.__path__.append(f"{tmp}/environments")
from grpo_exp.run import inert
inert.FEATURES = (*inert.FEATURES, feature)
from grpo_exp.errors import UserError
from grpo_exp.run.config_store import register_schemas
from grpo_exp.run.resolve import resolve
from grpo_exp.run.sources import compose_with
from support.config import TINY_RUN
register_schemas()
results = {}
for name, overrides in cases.items():
    cfg = compose_with([("command-line", f"file://{tmp}/conf")], [*TINY_RUN, *common, *overrides])
    try:
        resolve(cfg, processes=1)
        results[name] = "accepted"
    except UserError as err:
        results[name] = str(err)
print(json.dumps(results))
from grpo_exp.process_exit import leave
leave(0)  # as a command ends: not the interpreter's teardown of the model libraries (seconds)
"""


def follow_the_page(tmp_path, feature: str, common: list[str], cases: dict[str, list[str]]) -> dict[str, str]:
    """Each case resolved in a fresh process with the page's module (under tmp_path) added: "accepted", or the
    refusal's message."""
    (tmp_path / "conf").mkdir(exist_ok=True)
    ran = subprocess.run(
        [sys.executable, "-c", FOLLOW_THE_PAGE, str(tmp_path), feature, json.dumps(common), json.dumps(cases)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def code_block(page: str, language: str, opening: str) -> str:
    """The page's `language` code block whose text starts with `opening`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", page, flags=re.DOTALL)
    (found,) = [block for block in blocks if block.startswith(opening)]
    return found


def test_the_pages_reward_component_is_refused_and_accepted_as_the_page_says(tmp_path):
    page = PAGE.read_text(encoding="utf-8")
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "brevity.py").write_text(
        code_block(page, "python", '"""Brevity: 1 for a completion of at most max_words words; past it')
    )
    (tmp_path / "conf" / "reward").mkdir(parents=True)
    (tmp_path / "conf" / "reward" / "brevity.yaml").write_text(code_block(page, "yaml", "# Brevity:"))
    key = "reward.components.brevity"
    cases = {
        "defaults": [],
        "out of bounds": [f"{key}.max_words=0"],
        "past the completion": [f"{key}.max_words=5000"],
        "slack while strict": [f"{key}.slack=5"],
        "slack with partial credit": [f"{key}.slack=5", f"{key}.strict=false"],
    }
    common = ["reward=math+brevity", "trainer.max_completion_length=128"]
    results = follow_the_page(tmp_path, "grpo_exp.rewards.brevity", common, cases)
    assert results["defaults"] == "accepted" and results["slack with partial credit"] == "accepted"
    assert results["out of bounds"].startswith(f"{key}.max_words=0")
    assert results["past the completion"].startswith(f"{key}.max_words=5000 is more words than")
    assert results["slack while strict"] == (
        f"{key}.slack=5 is read only with partial credit past max_words ({key}.strict=false), but {key}.strict=true "
        f"pays 0 past max_words: set {key}.strict=false too, or leave {key}.slack out"
    )


def test_the_pages_environment_scheme_with_a_setting_of_its_own_is_refused_and_accepted_as_the_page_says(tmp_path):
    page = PAGE.read_text(encoding="utf-8")
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / "gridworld.py").write_text(
        code_block(page, "python", '"""A grid to walk to its corner in at most max_moves moves')
    )
    plays = ["rollout=environment", "rollout.environment=gridworld/5", "reward=environment"]
    cases = {
        "defaults": plays,
        "a good value": [*plays, "rollout.gridworld.max_moves=8"],
        "out of bounds": [*plays, "rollout.gridworld.max_moves=0"],
        "no grid world": ["rollout=multiturn", "rollout.tools=[calculator]", "rollout.gridworld.max_moves=8"],
        "a bad size": ["rollout=environment", "rollout.environment=gridworld/five", "reward=environment"],
    }
    results = follow_the_page(tmp_path, "grpo_exp.environments.gridworld", [], cases)
    assert results["defaults"] == "accepted" and results["a good value"] == "accepted", results
    assert results["out of bounds"] == "rollout.gridworld.max_moves=0 must be at least 1"
    assert results["no grid world"] == (
        "rollout.gridworld.max_moves=8 is read only by the grid world (rollout.environment=gridworld/<size>), but "
        "rollout.environment=None plays no grid world: set rollout.environment=gridworld/<size>, or leave "
        "rollout.gridworld.max_moves out"
    )
    assert results["a bad size"].startswith("rollout.environment=gridworld/five: the size is a whole number")
