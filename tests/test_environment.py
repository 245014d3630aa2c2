"""rollout=environment: the user's environment class in TRL's convention through grpo_exp's multi-turn loop. Its rules
and faults by hand, the example project run from outside the repository, several environments in one run, and a
failing environment costing episodes, not the run, under one process and two (GRPOTrainer really trains)."""

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from grpo_exp.errors import UserError
from grpo_exp.paths import REPO_ROOT
from grpo_exp.rollout.environment import (
    EnvironmentTimeout,
    Episode,
    check_environment_column,
    environment_statistics,
    load_environments,
    within,
)
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import DDP, accelerate_launch, run_command
from tests.helpers.episodes import write_user_module

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")
EXAMPLE = REPO_ROOT / "examples" / "guess"

ENVIRONMENTS = '''
import time


class Fine:
    def reset(self, question, solution, **row):
        self.secret = solution
        return f"The secret has {len(solution)} digit(s)."

    def peek(self, digit: int) -> str:
        """Whether the secret holds a digit.

        Args:
            digit: the digit
        """
        return "yes" if str(digit) in self.secret else "no"

    def explode(self) -> str:
        """Raises."""
        raise RuntimeError("boom")

    def get_reward(self) -> float:
        return 1.0


class Raising(Fine):
    def reset(self, question, solution, **row):
        raise KeyError("no such level")


class Hanging(Fine):
    def reset(self, question, solution, **row):
        time.sleep(30)


class Nonsense(Fine):
    def get_reward(self):
        return "lots"


class NoReset:
    def act(self, x: int) -> str:
        """Acts."""
        return "ok"


class Untyped:
    def reset(self, **row):
        return None

    def act(self, x):
        """Acts."""
        return "ok"


class AsyncReward(Fine):
    async def get_reward(self):
        return 1.0


def rows(names: list, count: int = 24):
    return [
        {"question": f"Find the secret {i}.", "answer": str(10 + i), "environment": names[i % len(names)]}
        for i in range(count)
    ]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> Path:
    return write_user_module(tmp_path, monkeypatch, "envs", ENVIRONMENTS)


# ---- by hand -----------------------------------------------------------------------------------------------------


def test_within_returns_raises_or_times_out():
    assert within(1.0, lambda: 3) == 3
    with pytest.raises(KeyError):
        within(1.0, lambda: {}["x"])
    started = time.perf_counter()
    with pytest.raises(EnvironmentTimeout, match="rollout.environment_timeout_s=0.2"):
        within(0.2, lambda: time.sleep(30))
    assert time.perf_counter() - started < 10  # not the call's 30 s (bounds with room: this tier runs at nice 19)


def test_the_environment_statistics_by_hand():
    records = [
        {"environment": "a", "env_reward": 1.0, "env_success": True, "env_failure": None},
        {"environment": "a", "env_reward": 0.0, "env_success": False, "env_failure": None},
        {"environment": "a", "env_reward": None, "env_success": False, "env_failure": "environment a: reset raised"},
        {"environment": "b", "env_reward": -1.0, "env_success": False, "env_failure": None},
    ]
    stats = environment_statistics(records)
    assert stats == {
        "environment/failures": 0.25,
        "environment/success": 0.25,
        "environment/a/failures": pytest.approx(1 / 3),
        "environment/a/reward_mean": 0.5,
        "environment/a/success": pytest.approx(1 / 3),  # a failed episode did not succeed
        "environment/b/failures": 0.0,
        "environment/b/reward_mean": -1.0,
        "environment/b/success": 0.0,
    }
    assert environment_statistics([{"num_turns": 1}]) == {}


def play(environment, timeout: float = 1.0) -> Episode:
    """An episode started; its time limit leaves the fine environments time to spare (make test runs this tier at
    the lowest CPU priority, support/test_tiers.py)."""
    episode = Episode(environment, timeout)
    episode.start({"question": "q", "solution": "42", "prompt": [], "environment": "x"})
    return episode


def test_each_fault_costs_the_episode_and_says_why(user_module):
    environments = load_environments(
        {"fine": "envs:Fine", "raising": "envs:Raising", "hanging": "envs:Hanging", "nonsense": "envs:Nonsense"}, 1.0
    )
    fine = play(environments["fine"])
    assert fine.failure is None and [t.name for t in fine.tools] == ["explode", "peek"]
    by_name = {t.name: t for t in fine.tools}
    assert by_name["peek"].run("4").output == "yes"
    broken = by_name["explode"].run("")  # a method that raises: an observation, not a failure
    assert broken.error and broken.output == "error: RuntimeError: boom" and fine.failure is None
    fine.finish()
    assert fine.reward == 1.0 and fine.success  # at least rollout.environment_success_at (1.0)
    raising = play(environments["raising"])
    assert raising.failure == "environment raising: reset raised KeyError: 'no such level'"
    started = time.perf_counter()
    hanging = play(environments["hanging"])
    assert hanging.failure == "environment hanging: reset ran past rollout.environment_timeout_s=1"
    assert time.perf_counter() - started < 10
    nonsense = play(environments["nonsense"])
    nonsense.finish()
    assert nonsense.failure == "environment nonsense: get_reward returned 'lots', not a finite number"
    assert nonsense.reward is None


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("envs:NoReset", "envs:NoReset: its instance has no reset()"),
        ("envs:Untyped", "its method act: parameter 'x' has no type hint"),
        ("envs:AsyncReward", "get_reward is async"),
        ("envs:Missing", "rollout.environment"),
    ],
)
def test_an_environment_that_breaks_the_convention_is_refused_naming_it(user_module, setting, message):
    with pytest.raises(UserError, match=message):
        load_environments(setting, 1.0)


def test_with_several_environments_every_row_must_name_one(user_module):
    environments = load_environments({"a": "envs:Fine", "b": "envs:Fine"}, 1.0)
    check_environment_column([{"environment": "a"}, {"environment": "b"}], environments, "training")
    with pytest.raises(UserError, match=r"training rows name \['None', 'c'\]"):
        check_environment_column([{"environment": "c"}, {}], environments, "training")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward=math+environment"], "reward=...environment scores episodes of your environment"),
        (["rollout=environment", "rollout.environment=envs:Fine"], "add it to the mix"),
        (["rollout=environment", "rollout.environment=envs:NoReset", "reward=environment"], "no reset"),
        (["rollout=environment", "rollout.environment=envs:Fine", "reward=environment", "rollout.tools=[envs:peek]"],
         "rollout.tools"),
    ],
)  # fmt: skip
def test_the_reward_and_the_tools_are_checked_with_the_run(user_module, overrides, message, no_model_loads):
    (user_module / "envs.py").write_text(ENVIRONMENTS + "\n\ndef peek(digit: int) -> str:\n    '''Peeks.'''\n")
    with pytest.raises(UserError, match=message):
        resolve(compose_config([*TINY_RUN, "logger=none", *overrides]), processes=1)


# ---- real runs ---------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_example_environment_trains_from_outside_the_repository(tmp_path):
    """examples/guess copied outside the repository, run with the installed grpo-exp as a user would (tiny model):
    validated every step on its held-out games, the best kept by their success rate; then evaluated again."""
    project = Path(shutil.copytree(EXAMPLE, tmp_path / "guess"))
    run = tmp_path / "run"
    metric = "heldout/environment/GuessTheNumber/success"
    result = run_command(
        [GRPO_EXP, "train", "--config-dir", "configs", "+experiment=guess", *TINY_RUN, "logger=none",
         "trainer.max_steps=2", "eval.every=1", f"eval.best_metric={metric}", f"hydra.run.dir={run}"],
        cwd=project,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 2 and all("environment/GuessTheNumber/reward_mean" in m for m in steps)
    assert all("rewards/environment/mean" in m for m in steps)
    assert all(metric in m for m in steps), "each validation reports the environment's success rate"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reward"] == "1*environment" and summary["best_metric"] == metric
    assert "heldout_environment_GuessTheNumber_success_before" in summary
    # scored by the environment, not by labels: the summary says so
    assert summary["scored_by"].startswith("the environment (") and "held-out episodes won" in result.stdout
    assert "answers read by" not in result.stdout
    assert "heldout_gain_format" not in summary and "held-out gain" not in result.stdout  # no reference answers
    assert (run / "checkpoint-best").is_dir()
    evaluated = run_command([GRPO_EXP, "evaluate", str(run), "eval.samples=0"], cwd=project)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((run / "evaluation.json").read_text())
    assert "environment/GuessTheNumber/success" in json.dumps(results), "the held-out games replayed"


def fault_run(names: list[str], *overrides: str) -> list[str]:
    environments = ", ".join(f"{name}: envs:{name.capitalize()}" for name in names)
    return [
        *TINY_RUN,
        "logger=none",
        "dataset=function",
        "dataset.function=envs:rows",
        f"+dataset.function_args.names=[{','.join(names)}]",
        "rollout=environment",
        "reward=environment",
        "rollout.max_turns=1",
        f"rollout.environment={{{environments}}}",
        "rollout.environment_timeout_s=0.5",
        "trainer.prompts_per_step=4",
        "trainer.max_steps=2",
        "eval.before=false",
        "eval.after=false",
        *overrides,
    ]


@pytest.mark.e2e
def test_failing_environments_cost_their_episodes_and_are_reported_per_environment(user_module):
    """Four environments in one run, by the rows' `environment` column; three fail every episode (raises, hangs,
    returns nonsense): each counted per environment, the run trains on."""
    names = ["fine", "raising", "hanging", "nonsense"]
    run = user_module / "run"
    overrides = ["rollout.environment_max_failure_rate=1.0", "trainer.prompts_per_step=8", f"hydra.run.dir={run}"]
    result = run_command([sys.executable, "-m", "grpo_exp.train", *fault_run(names, *overrides)], cwd=user_module)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 2
    seen = set()
    for step in steps:
        present = {name for name in names if f"environment/{name}/failures" in step}
        seen |= present
        for name in present - {"fine"}:
            assert step[f"environment/{name}/failures"] == 1.0
        if "fine" in present:
            assert step["environment/fine/failures"] == 0.0 and step["environment/fine/reward_mean"] == 1.0
        assert 0.0 < step["environment/failures"] <= 1.0
    assert seen == set(names), "the 16 episodes drew every environment"
    log = (run / "train.log").read_text()
    assert "Episode failed: environment hanging: reset ran past rollout.environment_timeout_s=0.5" in log
    assert "Episode failed: environment nonsense: get_reward returned 'lots', not a finite number" in log


@pytest.mark.e2e
@pytest.mark.parametrize("processes", [1, 2])
def test_past_the_failure_budget_the_run_stops_naming_the_environments(user_module, processes):
    names = ["raising", "hanging", "nonsense"]
    overrides = fault_run(names, "rollout.environment_max_failure_rate=0.5", f"hydra.run.dir={user_module / 'run'}")
    if processes == 1:
        result = run_command([sys.executable, "-m", "grpo_exp.train", *overrides], cwd=user_module)
    else:
        result = accelerate_launch(*overrides, accelerate_config=DDP, cwd=user_module)
    assert result.returncode != 0
    error = result.stdout + result.stderr
    # the first step's 4 prompts x G=2 episodes, on one process or two, all failed
    assert "the environment(s) raising, hanging, nonsense (rollout.environment) failed 8 of 8 episodes" in error
    assert "rollout.environment_max_failure_rate=0.5" in error
    assert not (user_module / "run" / "checkpoint-final").exists()


# ---- a built-in scheme's own settings: its dataclass, a section of the rollout config ---------------------------


def test_each_schemes_own_settings_are_a_section_of_the_runs_schema():
    import dataclasses

    from grpo_exp.environments.schemes import SETTINGS, builtin_schemes, settings_key
    from grpo_exp.environments.textarena import TextArenaSettings
    from grpo_exp.run.config_store import run_schema

    builtin_schemes()
    rollout = {
        field.name: field.type for field in dataclasses.fields(run_schema().__dataclass_fields__["rollout"].type)
    }
    assert SETTINGS["textarena/"] is TextArenaSettings and SETTINGS["openenv/"] is None
    for prefix, settings in SETTINGS.items():
        if settings is not None:
            assert rollout[settings_key(prefix)] is settings, prefix
    assert compose_config().rollout.textarena.invalid_move_credit is False


def test_a_scheme_is_built_with_its_own_settings_and_no_other(monkeypatch):
    from dataclasses import dataclass

    from grpo_exp.environments import schemes

    @dataclass
    class GridSettings:
        walls: bool = False

    seen = {}

    def grid(size: str, walls: bool = False):
        seen.update(size=size, walls=walls)
        return lambda: None

    monkeypatch.setitem(schemes.SCHEMES, "grid/", grid)
    monkeypatch.setitem(schemes.SETTINGS, "grid/", GridSettings)
    rollout = {"grid": {"walls": True}, "textarena": {"invalid_move_credit": True}, "max_turns": 3}
    schemes.build_scheme("grid/", "5", rollout)
    assert seen == {"size": "5", "walls": True}
    schemes.build_scheme("grid/", "7", None)  # no rollout config: the builder's defaults
    assert seen == {"size": "7", "walls": False}


def test_a_schemes_settings_are_a_dataclass_under_a_name():
    from dataclasses import dataclass

    from grpo_exp.environments.schemes import environment_scheme

    @dataclass
    class GridSettings:
        walls: bool = False

    with pytest.raises(TypeError, match="its settings are a dataclass"):
        environment_scheme("grid/", settings=("walls",))
    with pytest.raises(ValueError, match="a scheme with settings is a name"):
        environment_scheme("my-grid/", settings=GridSettings)
