"""rollout.environment=openenv/<url>: an OpenEnv environment served over its HTTP protocol (openenv-core's own server,
started here in a process of its own with uvicorn), driven as an environment by OpenEnv's own client: its action as
the `step` tool, its step rewards turn by turn, its return as get_reward(); and a tiny run training against it."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from grpo_exp.errors import UserError
from grpo_exp.rollout.environment import Episode, load_environments
from grpo_exp.rollout.multiturn import Trajectory
from support.config import TINY_RUN
from support.servers import free_port
from tests.helpers.cli import run_command
from tests.helpers.episodes import played, trained_steps

# Found, not imported: openenv.core imports gradio (~5 CPU-s), which every pytest worker would pay at collection
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None, reason="openenv-core is installed by `make install` (the dev extras)"
)

SERVER = '''
"""Guess a number from 1 to 20 in OpenEnv's server API: each wrong guess costs 0.1, the right one earns 1 and ends."""
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field


class GuessAction(Action):
    guess: int = Field(..., description="your guess, from 1 to 20")


class GuessObservation(Observation):
    message: str = Field(default="", description="what the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state, self.secret = State(episode_id=str(uuid4()), step_count=0), 1

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.secret = (seed or 0) % 20 + 1
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(message="I am thinking of a number from 1 to 20.", done=False, reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(message="Right!", done=True, reward=1.0)
        hint = "higher" if action.guess < self.secret else "lower"
        return GuessObservation(message=f"No, {hint}.", done=False, reward=-0.1)

    @property
    def state(self):
        return self._state

    def get_metadata(self):
        return EnvironmentMetadata(name="guess", description="Guess a number from 1 to 20.")


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The OpenEnv server, in a process of its own (uvicorn), until the module's tests are done."""
    directory = tmp_path_factory.mktemp("openenv")
    (directory / "guess_server.py").write_text(SERVER)
    port = free_port()
    log = (directory / "server.log").open("w")  # a file, not a pipe: a full pipe would block the server
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "guess_server:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    # Its imports take 6 s alone; with both tiers' workers on 2 cores CI saw more than 60 s, the log still empty.
    deadline = time.monotonic() + 300
    while True:
        try:
            if requests.get(f"{url}/health", timeout=1).ok:
                break
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the OpenEnv server did not start: {(directory / 'server.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield url
    process.kill()  # the sessions' end is tested above; the server's own graceful shutdown is not ours to wait for
    process.wait(timeout=10)
    log.close()


def play(url: str, moves: list[str], seed: str = "6") -> tuple[Trajectory, Episode]:
    """An episode on the server, each move a turn; its reset's text kept as the first observation."""
    trajectory, episode, observation = played(f"openenv/{url}", moves, {"question": "Guess.", "solution": seed})
    trajectory.observations.insert(0, observation)
    return trajectory, episode


def test_the_servers_action_is_the_step_tool_described_from_its_schema(server):
    (environment,) = load_environments(f"openenv/{server}", 10.0).values()
    assert environment.name == "guess"  # the server's own name (GET /metadata)
    assert environment.tool_names == ("step",) and environment.has_reward
    (tool,) = environment.tools
    assert tool.parameter_descriptions == {"guess": "your guess, from 1 to 20"}


def test_an_episode_over_the_servers_protocol(server):
    """Seed 6: the secret is 7. Two wrong guesses (-0.1 each, with the server's hints) and the right one (+1, done);
    a fourth step after done is not sent."""
    trajectory, episode = play(server, ["<step>10</step>", "<step>5</step>", "<step>7</step>", "<step>7</step>"])
    assert trajectory.observations[0] == "I am thinking of a number from 1 to 20."
    assert [o.strip() for o in trajectory.observations[1:]] == [
        "<result>No, lower.</result>",
        "<result>No, higher.</result>",
        "<result>Right!</result>",
    ]
    assert trajectory.turn_rewards == pytest.approx([-0.1, -0.1, 1.0, 0.0])
    assert episode.reward == pytest.approx(0.8) and episode.failure is None  # the return: the step rewards' sum
    assert episode.instance.client is None  # the session ended with the episode


def test_sessions_are_episodes_of_their_own(server):
    """Two episodes at once, seeded differently, each its own session on the server."""
    first, _ = play(server, ["<step>7</step>"], seed="6")
    second, _ = play(server, ["<step>7</step>"], seed="0")
    assert first.turn_rewards == [1.0] and second.turn_rewards == [-0.1]


def test_no_server_at_the_address_is_refused_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=f"rollout.environment=openenv/{url}: no OpenEnv server answers there"):
        load_environments(f"openenv/{url}", 10.0)


@pytest.mark.e2e
def test_a_tiny_run_trains_against_the_server_with_per_turn_credit(server, tmp_path):
    """Two steps of GRPO on the tiny model, every episode a session of the server, each turn credited with its
    discounted return: no episode fails and the environment's statistics are the server's."""
    (tmp_path / "seeds.py").write_text(
        "def rows():\n    return [{'question': 'Guess the number.', 'answer': str(i)} for i in range(12)]\n"
    )
    run = tmp_path / "run"
    args = [
        *TINY_RUN,
        "logger=none",
        "dataset=function",
        "dataset.function=seeds:rows",
        "dataset.eval_size=2",
        "rollout=environment",
        "reward=environment",
        f"rollout.environment=openenv/{server}",
        "rollout.max_turns=2",
        "rollout.turn_credit=discounted_return",
        "trainer.prompts_per_step=2",
        "trainer.max_steps=2",
        "eval.before=false",
        "eval.after=false",
        f"hydra.run.dir={run}",
    ]
    result = run_command([sys.executable, "-m", "grpo_exp.train", *args], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = trained_steps(run, 2)
    assert all(step["environment/guess/failures"] == 0.0 for step in steps)
    assert all("environment/guess/reward_mean" in step for step in steps)
    assert Path(run / "checkpoint-final").exists()
