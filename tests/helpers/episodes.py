"""Environments in tests: the user's module written where a run imports it, an episode stepped as grpo_exp's loop
steps it (each move one turn of the policy's text), and the steps a short training run logged."""

import math
import sys
from pathlib import Path

from grpo_exp.rollout.environment import Episode
from grpo_exp.rollout.multiturn import MultiTurnRollout, Trajectory
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN, compose_config


def write_user_module(tmp_path: Path, monkeypatch, name: str, text: str) -> Path:
    """`name`.py holding `text` in tmp_path, the current directory and importable (a fresh import each test)."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return tmp_path


class OneTokenPerMove:
    """A stand-in tokenizer: a turn's single token id indexes its move; an observation is one token per character."""

    pad_token_id = eos_token_id = -1

    def __init__(self, moves: list[str]):
        self.moves = moves

    def decode(self, ids, skip_special_tokens=True):
        return self.moves[ids[0]]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [0] * len(text)}


def played(setting: str, moves: list[str], row: dict, timeout: float = 10.0) -> tuple[Trajectory, Episode, str | None]:
    """An episode of rollout.environment=`setting` reset with `row` and played through grpo_exp's loop, each move a
    turn, then finished; with the text its reset returned."""
    cfg = compose_config([*TINY_RUN, "rollout=environment", f"rollout.environment={setting}"])
    rollout = MultiTurnRollout(cfg.rollout)
    (environment,) = rollout.environments.values()
    episode = Episode(environment, timeout)
    observation = episode.start(row)
    trajectory = Trajectory([], tools=episode.tools, episode=episode)
    for index in range(len(moves)):
        rollout._advance(trajectory, [index], OneTokenPerMove(moves), last_turn=index == len(moves) - 1)
    episode.finish()
    return trajectory, episode, observation


def trained_steps(run: Path, steps: int) -> list[dict]:
    """The run's logged training steps, checked: `steps` of them, each with a finite loss."""
    logged = [m for m in read_metrics(run / "metrics.jsonl") if "loss" in m]
    assert len(logged) == steps and all(math.isfinite(step["loss"]) for step in logged), logged
    return logged
