"""The user's own reward components and config directory, as a user meets them: a project directory of their own
(a module and a config directory, made here in tmp_path), the `grpo-exp` command run from it.

Mixes (`reward=math+mine`) find parts in every config directory of Hydra's search path; a reward component names
its function or factory by import path, the project directory importable; every mistake is one message naming the
key, before any model loads."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import STATUS_FILE
from support.config import TINY_RUN
from tests.helpers.cli import run_command
from tests.helpers.resolve_cases import resolve_cases

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")

USER_MODULE = '''
import json


def constant(completions, **kwargs):
    return [0.25 for _ in completions]


def make_length_reward(per_char, log):
    """A factory: the reward is per_char x the completion's length; every call's rewards go to `log`."""

    def length_reward(prompts, completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [per_char * len(text) for text in texts]
        with open(log, "a") as f:
            f.write(json.dumps({"rewards": rewards, "columns": sorted(kwargs)}) + "\\n")
        return rewards

    return length_reward


def no_kwargs(prompts, completions):
    return [0.0 for _ in completions]


NOT_CALLABLE = 3
'''

USER_CONFIGS = {
    "reward/mine.yaml": """
        # the user's own component, a factory with its settings
        defaults:
          - /reward_component/custom@components.mine
          - _self_
        components:
          mine:
            weight: 0.5
            factory: user_rewards:make_length_reward
            settings: {per_char: 0.01, log: calls.jsonl}
    """,
    "reward/flat.yaml": """
        defaults:
          - /reward_component/custom@components.flat
          - _self_
        components:
          flat:
            weight: 1.0
            function: user_rewards:constant
    """,
    "experiment/mine.yaml": """
        # @package _global_
        defaults:
          - override /reward: math+flat
        trainer:
          beta: 0.03
    """,
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project directory: user_rewards.py and a config directory, configs/."""
    (tmp_path / "user_rewards.py").write_text(USER_MODULE)
    for name, text in USER_CONFIGS.items():
        path = tmp_path / "configs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def grpo_exp(project: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`grpo-exp <args>` run from the user's project directory, as they run it."""
    assert GRPO_EXP.is_file(), f"{GRPO_EXP} is missing: install the package (make install)"
    return run_command([GRPO_EXP, *args], cwd=project, timeout=timeout)


def composed(project: Path, *args: str) -> dict:
    result = grpo_exp(project, "train", "--config-dir", "configs", "--cfg", "job", *args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_a_mix_takes_parts_from_the_users_config_dir(project):
    components = composed(project, "reward=math+mine+flat")["reward"]["components"]
    assert list(components) == ["math", "mine", "flat"]
    assert components["mine"] == {
        "weight": 0.5,
        "function": None,
        "factory": "user_rewards:make_length_reward",
        "settings": {"per_char": 0.01, "log": "calls.jsonl"},
    }
    assert components["flat"]["function"] == "user_rewards:constant"
    assert composed(project, "reward=mine")["reward"]["components"]["mine"]["weight"] == 0.5


def test_hydra_searchpath_finds_the_users_parts_too(project):
    result = run_command(
        [sys.executable, "-m", "grpo_exp.train", "--cfg", "job", f"hydra.searchpath=[file://{project / 'configs'}]"]
        + ["reward=flat+format", "reward.components.flat.weight=2"],
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    components = yaml.safe_load(result.stdout)["reward"]["components"]
    assert list(components) == ["flat", "format"] and components["flat"]["weight"] == 2


def test_the_users_experiment_preset_is_found(project):
    cfg = composed(project, "+experiment=mine")
    assert list(cfg["reward"]["components"]) == ["math", "flat"] and cfg["trainer"]["beta"] == 0.03


def test_an_unknown_part_lists_the_known_ones_with_the_users(project):
    result = grpo_exp(project, "train", "--config-dir", "configs", "reward=math+nope")
    assert result.returncode != 0
    known = "known components: confidence, correct, environment, flat, format, judge, length, length_by_correctness"
    assert known in result.stderr
    assert "Traceback" not in result.stderr


# The resolve phase, in one process started in the user's project: each case's one message.
RESOLVE_CASES = {
    "bad module": (
        ["reward=math+flat", "reward.components.flat.function=no_such_pkg.rewards:f"],
        "reward.components.flat.function=no_such_pkg.rewards:f: module 'no_such_pkg' not found",
    ),
    "bad attribute": (
        ["reward=math+flat", "reward.components.flat.function=user_rewards:nope"],
        "reward.components.flat.function=user_rewards:nope: module 'user_rewards' has no attribute 'nope'",
    ),
    "not callable": (
        ["reward=flat", "reward.components.flat.function=user_rewards:NOT_CALLABLE"],
        "reward.components.flat.function=user_rewards:NOT_CALLABLE: not callable (int 3)",
    ),
    "no **kwargs": (
        ["reward=flat", "reward.components.flat.function=user_rewards:no_kwargs"],
        "reward.components.flat.function=user_rewards:no_kwargs: must accept **kwargs",
    ),
    "factory settings": (
        ["reward=mine", "+reward.components.mine.settings.colour=red"],
        "reward.components.mine.factory=user_rewards:make_length_reward: does not take the keys of "
        "reward.components.mine.settings ['colour', 'log', 'per_char']: got an unexpected keyword argument",
    ),
    "neither": (
        ["reward=mine", "reward.components.mine.factory=null"],
        "reward.components.mine: set reward.components.mine.function (a reward function) or",
    ),
    "no yaml": (["+reward.components.own.function=user_rewards:constant", "+reward.components.own.weight=1"], None),
}

REPORT = """
def report(spec):
    return {"components": {k: float(v.weight) for k, v in spec.components.items()}}
"""


def test_a_bad_import_path_or_signature_is_one_message_naming_the_key(project):
    base = [*TINY_RUN, "logger=none", f"hydra.searchpath=[file://{project / 'configs'}]"]
    cases = {name: overrides for name, (overrides, _) in RESOLVE_CASES.items()}
    messages = resolve_cases(cases, base, cwd=project, report=REPORT)
    for name, (_, expected) in RESOLVE_CASES.items():
        if expected is None:
            assert messages[name] == {"components": {"math": 1.0, "own": 1.0}}, messages[name]
        else:
            assert expected in messages[name], (name, messages[name])


def test_the_command_line_prints_a_bad_import_path_without_a_traceback_or_a_model(project):
    result = grpo_exp(
        project, "train", "--config-dir", "configs", *TINY_RUN, "logger=none", "reward=math+mine",
        "reward.components.mine.factory=user_rewards.make_nothing",
    )  # fmt: skip
    assert result.returncode != 0
    expected = "reward.components.mine.factory=user_rewards.make_nothing: module 'user_rewards' has no attribute"
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Loading model" not in result.stdout + result.stderr


def test_a_sweep_over_the_users_component_and_its_weight_composes_every_job(project):
    """4 jobs (mix x weight), each resolved with the user's reward checked, then stopped by a missing data file
    (the last check before anything is built): no training."""
    sweep = project / "sweep"
    result = grpo_exp(
        project, "train", "--config-dir", "configs", "-m", *TINY_RUN, "logger=none", "reward=math+mine,mine",
        "reward.components.mine.weight=0.5,1", "dataset=files", "dataset.path=/nope/train.jsonl",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode != 0  # every job stopped at the data file
    seen = set()
    for job in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        status = json.loads((job / STATUS_FILE).read_text())
        assert "dataset.path='/nope/train.jsonl' does not exist" in status["error"], status
        components = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["reward"]["components"]
        seen.add(("+".join(components), components["mine"]["weight"]))
    assert seen == {(mix, weight) for mix in ("math+mine", "mine") for weight in (0.5, 1)}


@pytest.mark.e2e
def test_the_users_reward_trains_and_is_logged_as_what_it_returned(project):
    """`grpo-exp train --config-dir configs reward=math+mine`: TRL's GRPOTrainer trains the tiny model two steps with
    the user's factory-made reward; rewards/mine/mean is the mean of what the function returned at that step."""
    run_dir = project / "run"
    result = grpo_exp(
        project, "train", "--config-dir", "configs", *TINY_RUN, "logger=none", "eval.before=false",
        "reward=math+mine", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (project / "calls.jsonl").read_text().splitlines()]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rewards/mine/mean" in m]
    # The labels check scores the untrained policy's answers once before the first step (probe.problems of them).
    check, *training = calls
    assert check["rewards"] and "trainer_state" in check["columns"]
    assert len(steps) == len(training) == 2
    for step, call in zip(steps, training, strict=True):
        assert len(call["rewards"]) == 4  # trainer=debug: 2 prompts x G=2
        assert step["rewards/mine/mean"] == pytest.approx(sum(call["rewards"]) / 4, abs=1e-6)
        assert {"question", "solution", "completion_ids", "trainer_state"} <= set(call["columns"])
    assert any(r > 0 for call in calls for r in call["rewards"])  # lengths, not a constant
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert list(saved["reward"]["components"]) == ["math", "mine"]
    assert saved["reward"]["components"]["mine"]["weight"] == 0.5
