"""examples/capitals, used exactly as a user would: copied outside the repository, the installed `grpo-exp` run from
its directory with its own config directory (a reward, correctness labels, a data file, a tool, a judge rubric)."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_exp.paths import REPO_ROOT
from grpo_exp.run.tracking import read_metrics
from grpo_exp.verification.labels import built_in_labels
from tests.helpers.cli import run_command

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")
EXAMPLE = REPO_ROOT / "examples" / "capitals"
SMALL = ["trainer.max_steps=1", "logger=none", "judge.model=tiny", "save_model=false", "trainer.save_steps=0"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The example project on its own, outside the repository."""
    return Path(shutil.copytree(EXAMPLE, tmp_path / "capitals"))


def grpo_exp(project: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return run_command([GRPO_EXP, *args], cwd=project, timeout=timeout)


def users_labels(project: Path, samples: list[dict]) -> list[bool]:
    """The project's own is_correct on each sample, imported from the project as the run imported it."""
    script = textwrap.dedent(
        """
        import json, sys
        from capitals import is_correct
        samples = json.load(sys.stdin)
        print(json.dumps([is_correct(s["final_turn"] or s["completion"], s["solution"]) for s in samples]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=project, input=json.dumps(samples), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.e2e
def test_the_example_sweeps_its_own_reward_weight_and_data_source(project):
    """A sweep through grpo-exp train -m: the file and the function as data, the project's reward at two weights."""
    sweep = project / "sweep"
    result = grpo_exp(
        project,
        "train",
        "-m",
        "--config-dir",
        "configs",
        "+experiment=capitals,capitals_function",
        "reward.components.concise.weight=0.25,1.0",
        "model=tiny",
        "trainer=debug",
        "dataset.eval_size=4",
        "eval.before=false",
        *SMALL,
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in range(4)]
    assert [s["reward"] for s in summaries] == [
        "1*correct + 0.25*concise + 1*judge",
        "1*correct + 1*concise + 1*judge",
    ] * 2
    for job in range(4):
        logged = read_metrics(sweep / str(job) / "metrics.jsonl")
        assert any("rewards/concise/mean" in line and "rewards/judge/mean" in line for line in logged)


@pytest.mark.slow
def test_the_example_trains_the_embedded_model_with_its_own_labels_and_tool(project):
    """The embedded model answers capitals in words: held-out accuracy, the group statistics and the `correct` reward
    come from the project's is_correct (math-verify would call every such answer wrong), and the policy calls the
    project's tool."""
    run = project / "run"
    result = grpo_exp(
        project,
        "train",
        "--config-dir",
        "configs",
        "+experiment=capitals",
        "dataset.eval_size=8",
        "eval.after=false",
        *SMALL,
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    samples = [json.loads(line) for line in (run / "eval_before.jsonl").read_text().splitlines()]
    labels = users_labels(project, samples)
    assert [s["correct"] for s in samples] == labels
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout_accuracy_before"] == sum(labels) / len(labels) > 0.5
    assert not any(built_in_labels()([s["final_turn"] for s in samples], [s["solution"] for s in samples]))
    assert sum(s["tool_calls"] for s in samples) > 0, "the policy looked capitals up with the project's tool"
    step = next(line for line in read_metrics(run / "metrics.jsonl") if "rewards/correct/mean" in line)
    assert step["rewards/correct/mean"] > 0 and step["groups/pass@1"] == step["rewards/correct/mean"]
