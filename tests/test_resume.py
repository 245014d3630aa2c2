"""trainer.resume and determinism: an interrupted run continues where it stopped, with the same results."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from grpo_exp.errors import UserError
from grpo_exp.run.resume import (
    carry_history,
    explicit_attempt,
    find_attempt,
    is_complete,
    last_checkpoint,
    load_attempt,
)
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN
from tests.helpers.cli import interrupted_when, run_cli

# Eight steps, a resumable checkpoint every two; `length` gives the tiny model's completions a reward spread.
RUN = [*TINY_RUN, "reward=math+format+length", "trainer.max_steps=8", "trainer.save_steps=2"]
PER_STEP = ("reward", "loss", "grad_norm", "rewards/length/mean", "completions/mean_length")


def per_step(run_dir: Path) -> dict[int, tuple]:
    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward" in m]
    assert len(rows) == len({m["step"] for m in rows}), "a step was logged twice"
    return {m["step"]: tuple(m[k] for k in PER_STEP) for m in rows}


def run_dirs(outputs: Path) -> list[Path]:
    return sorted(p.parent for p in (outputs / "runs").rglob(".hydra"))


def interrupt_after_first_checkpoint(args: list[str], outputs: Path) -> subprocess.CompletedProcess:
    """Start a run and send it SIGTERM (what Slurm sends at its time limit) once a checkpoint is complete."""
    return interrupted_when(args, lambda: any(outputs.rglob("checkpoint-*/trainer_state.json")))


@pytest.mark.e2e
def test_an_interrupted_run_resumes_from_its_checkpoint_and_ends_as_if_never_stopped(tmp_path):
    outputs = tmp_path / "outputs"
    args = [*RUN, "logger=wandb", f"outputs_dir={outputs}"]
    first = interrupt_after_first_checkpoint(args, outputs)
    assert first.returncode != 0
    [first_dir] = run_dirs(outputs)
    assert not (first_dir / "summary.json").exists()
    stopped_at = load_attempt(first_dir).step
    assert 2 <= stopped_at < 8

    second = run_cli(*args, "trainer.resume=auto")
    assert second.returncode == 0, second.stderr[-3000:]
    second_dir = next(d for d in run_dirs(outputs) if d != first_dir)
    summary = json.loads((second_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["resumed_from"].endswith(f"checkpoint-{stopped_at}")
    # the same W&B run continued (not a duplicate), and one metrics file holding the whole run
    assert json.loads((first_dir / "attempt.json").read_text())["wandb_id"] == summary["wandb_id"]
    assert sorted(per_step(second_dir)) == list(range(1, 9))

    # CPU training is deterministic (the first attempt's steps are the same command run twice), and the checkpoint
    # restores weights, optimiser, RNG and data order: the resumed run logs exactly what a run never interrupted
    # logs, its sampled completions included.
    reference_outputs = tmp_path / "reference"
    reference = run_cli(*RUN, "logger=none", f"outputs_dir={reference_outputs}")
    assert reference.returncode == 0, reference.stderr[-3000:]
    [reference_dir] = run_dirs(reference_outputs)
    assert per_step(second_dir) == per_step(reference_dir)
    samples = [(d / "samples.jsonl").read_text() for d in (second_dir, reference_dir)]
    assert samples[0] == samples[1] and samples[0]
    assert not list(second_dir.glob("trainer/checkpoint-*")), "a finished run keeps checkpoint-final only"

    # started a third time, the finished run is reported, not trained again
    third = run_cli(*args, "trainer.resume=auto")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "already finished" in third.stderr + third.stdout
    third_dir = max(run_dirs(outputs), key=lambda d: d.stat().st_mtime)
    assert json.loads((third_dir / "summary.json").read_text())["resumed_from"] == str(second_dir)
    assert per_step(third_dir) == per_step(second_dir)


# ---- the pieces, on hand-made run directories ------------------------------------------------------------


def make_run(root: Path, config: dict, steps: list[int], checkpoints: dict[int, bool], finished=False) -> Path:
    run_dir = root / f"run-{len(list(root.iterdir())) if root.exists() else 0}"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 10}) + "\n" for s in steps))
    for step, complete in checkpoints.items():
        checkpoint = run_dir / "trainer" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        if complete:
            (checkpoint / "trainer_state.json").write_text("{}")
    if finished:
        (run_dir / "summary.json").write_text("{}")
    return run_dir


CONFIG = {"trainer": {"num_generations": 4, "resume": None}, "dataset": {"name": "arith"}}


def test_a_checkpoint_cut_off_while_saving_is_not_resumed_from(tmp_path):
    run_dir = make_run(tmp_path, CONFIG, [1, 2, 3, 4], {2: True, 4: False})
    assert last_checkpoint(run_dir / "trainer").name == "checkpoint-2"


@pytest.mark.parametrize("state", ["", '{"global_step": 4, "log_history": [', "[]"])
def test_a_checkpoint_whose_state_was_cut_while_written_is_not_complete(tmp_path, state):
    """SIGTERM raises mid-write (grpo_exp.run.interruption): an empty or cut trainer_state.json is no checkpoint to
    resume from, and the interrupted run saves that step again instead of taking it as saved."""
    run_dir = make_run(tmp_path, CONFIG, [1, 2, 3, 4], {2: True})
    cut = run_dir / "trainer" / "checkpoint-4"
    cut.mkdir(parents=True)
    (cut / "trainer_state.json").write_text(state)
    assert not is_complete(cut) and is_complete(run_dir / "trainer" / "checkpoint-2")
    assert last_checkpoint(run_dir / "trainer").name == "checkpoint-2"
    with pytest.raises(UserError, match=f"trainer.resume={cut}: this checkpoint was cut while it was saved"):
        explicit_attempt(cut)
    assert explicit_attempt(run_dir).checkpoint.name == "checkpoint-2"  # its run directory: the last complete one


def test_auto_picks_the_latest_attempt_with_the_same_config_only(tmp_path):
    older = make_run(tmp_path, CONFIG, [1, 2], {2: True})
    other = {**CONFIG, "dataset": {"name": "chain_sum"}}
    make_run(tmp_path, other, [1, 2, 3, 4], {4: True})  # a different run
    make_run(tmp_path, CONFIG, [1], {})  # stopped before its first checkpoint: nothing to resume
    time.sleep(0.01)
    newer = make_run(tmp_path, CONFIG, [1, 2, 3, 4], {2: True, 4: True})
    os.utime(older / "config.yaml", (0, 0))
    wanted = {**CONFIG, "trainer": {**CONFIG["trainer"], "resume": "auto"}}  # resume itself does not count
    attempt = find_attempt(tmp_path, wanted)
    assert attempt.run_dir == newer and attempt.step == 4 and not attempt.finished
    assert find_attempt(tmp_path, {**CONFIG, "trainer": {"num_generations": 8}}) is None


def test_history_is_carried_up_to_the_checkpoint(tmp_path):
    old = make_run(tmp_path / "outputs", CONFIG, [1, 2, 3], {2: True})
    new = tmp_path / "new"
    new.mkdir()
    carry_history(load_attempt(old), new)
    assert [m["step"] for m in read_metrics(new / "metrics.jsonl")] == [1, 2]  # step 3 is trained again


def test_a_run_killed_while_writing_a_line_resumes_and_a_damaged_history_is_one_message(tmp_path):
    old = make_run(tmp_path / "outputs", CONFIG, [1, 2, 3], {2: True})
    with (old / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 4, "rew')  # the line the kill cut short
    (tmp_path / "outputs" / "damaged" / ".hydra").mkdir(parents=True)  # another run's config, damaged: not ours
    (tmp_path / "outputs" / "damaged" / "config.yaml").write_text("trainer: [")
    wanted = {**CONFIG, "trainer": {**CONFIG["trainer"], "resume": "auto"}}
    assert find_attempt(tmp_path / "outputs", wanted).run_dir == old
    new = tmp_path / "new"
    new.mkdir()
    carry_history(load_attempt(old), new)
    assert [m["step"] for m in read_metrics(new / "metrics.jsonl")] == [1, 2]
    lines = (old / "metrics.jsonl").read_text().splitlines()
    (old / "metrics.jsonl").write_text("\n".join([lines[0], "{damaged", *lines[1:]]))
    with pytest.raises(UserError, match=r"trainer.resume: .*metrics.jsonl: line 2 is not JSON"):
        carry_history(load_attempt(old), new)
    (old / "attempt.json").write_text("{")
    with pytest.raises(UserError, match=r"trainer.resume: .*attempt.json: not JSON"):
        load_attempt(old)


def test_an_explicit_resume_path_must_hold_a_checkpoint(tmp_path):
    run_dir = make_run(tmp_path, CONFIG, [1, 2], {2: True})
    assert explicit_attempt(run_dir).step == 2
    assert explicit_attempt(run_dir / "trainer" / "checkpoint-2").run_dir == run_dir
    empty = make_run(tmp_path, CONFIG, [1], {})
    with pytest.raises(UserError, match="trainer.resume="):
        explicit_attempt(empty)
