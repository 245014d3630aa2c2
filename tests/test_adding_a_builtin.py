"""docs/adding-a-builtin.md, followed as written: its reward component `brevity` (its module, with a check against the
run and a setting read only given another, and its YAML) added to a copy of the run in a fresh process, then refused
and accepted as the page says. The registries are the process's own: nothing registered here reaches other tests."""

import json
import re
import subprocess
import sys

from grpo_exp.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "adding-a-builtin.md"

# In a fresh process: grpo_exp.rewards searched in the temporary directory too (every module of the package is
# imported when the registry is read), the new module listed among the features that declare rules (the page's
# step), and each case's config composed with the temporary config directory, then resolved.
FOLLOW_THE_PAGE = """
import json, sys
tmp, cases = sys.argv[1], json.loads(sys.argv[2])
import grpo_exp.rewards
grpo_exp.rewards.__path__.append(f"{tmp}/rewards")
from grpo_exp.run import inert
inert.FEATURES = (*inert.FEATURES, "grpo_exp.rewards.brevity")
from grpo_exp.errors import UserError
from grpo_exp.run.config_store import register_schemas
from grpo_exp.run.resolve import resolve
from grpo_exp.run.sources import compose_with
from support.config import TINY_RUN
register_schemas()
results = {}
common = [*TINY_RUN, "reward=math+brevity", "trainer.max_completion_length=128"]
for name, overrides in cases.items():
    cfg = compose_with([("command-line", f"file://{tmp}/conf")], [*common, *overrides])
    try:
        resolve(cfg, processes=1)
        results[name] = "accepted"
    except UserError as err:
        results[name] = str(err)
print(json.dumps(results))
"""


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
    ran = subprocess.run(
        [sys.executable, "-c", FOLLOW_THE_PAGE, str(tmp_path), json.dumps(cases)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads(ran.stdout.strip().splitlines()[-1])
    assert results["defaults"] == "accepted" and results["slack with partial credit"] == "accepted"
    assert results["out of bounds"].startswith(f"{key}.max_words=0")
    assert results["past the completion"].startswith(f"{key}.max_words=5000 is more words than")
    assert results["slack while strict"] == (
        f"{key}.slack=5 is read only with partial credit past max_words ({key}.strict=false), but {key}.strict=true "
        f"pays 0 past max_words: set {key}.strict=false too, or leave {key}.slack out"
    )
