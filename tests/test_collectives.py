"""Every rank makes the same torch.distributed calls in the same order, over the feature matrix: 2 gloo processes
on CPU, the tiny model, each rank's calls recorded (tests/helpers/recorded_run.py) and compared."""

import json
from pathlib import Path

import pytest

from grpo_exp.paths import REPO_ROOT
from support.servers import free_port, stub_judge_overrides, stub_server
from tests.helpers.cli import EVAL_SHARES, SPREAD, logged_steps, recorded_launch
from tests.helpers.recorder import mismatch, read_records

# The tiny model is never right and never boxes an answer: keep its answers as candidates, "No" examples all.
SELFVERIFY = [
    "reward=math+selfverify",
    "trainer.prompts_per_step=4",
    "reward.components.selfverify.drop_no_answer=false",
    "reward.components.selfverify.drop_all_wrong=false",
    "reward.components.selfverify.balance=share",
]

# Each a run of its own, features that can share a run combined; the defaults (evaluation before and after, W&B,
# checkpoints) are tests/conftest.py's tiny_ddp_run, and skip with the shared prompt on its skip_ddp_run, shared with
# test_distributed.py.
FEATURES = {
    "keep, shared prompt off, validation every step, the best two checkpoints": [
        "trainer.zero_variance_groups=keep",
        "trainer.shared_prompt_forward=false",
        "eval.every=1",
        "eval.every_problems=3",
        "eval.keep_top_k=2",
    ],
    "selfverify joint, supervised, held-out verification benchmark": [
        *SELFVERIFY,
        "reward.components.selfverify.objective=supervised",
        "eval.verification_benchmark.enabled=true",
        "eval.verification_benchmark.problems=4",
    ],
    "selfverify verify_only": [*SELFVERIFY, "reward.components.selfverify.schedule=verify_only"],
    "multi-turn rollout, its mismatch weighted and checked in float64": [
        "rollout=multiturn",
        "trainer.mismatch_correction=token_truncate",
        "trainer.float64_reference_every=1",
    ],
}


def assert_same_calls(record_dir: Path, allow_early_end: bool = False) -> dict[int, list[dict]]:
    records = read_records(record_dir / "calls")
    assert sorted(records) == [0, 1], records.keys()
    assert (problem := mismatch(records, allow_early_end)) is None, problem
    return records


@pytest.mark.e2e
@pytest.mark.parametrize("overrides", FEATURES.values(), ids=FEATURES.keys())
def test_every_rank_makes_the_same_collective_calls(tmp_path, overrides):
    result = recorded_launch(tmp_path, *overrides)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_calls(tmp_path)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["processes"] == 2


@pytest.mark.e2e
def test_with_the_judge_every_rank_makes_the_same_collective_calls(tmp_path):
    port = free_port()
    with stub_server("good", port):
        result = recorded_launch(
            tmp_path,
            "reward=math+format+judge",
            *stub_judge_overrides(port),
        )
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_calls(tmp_path)


@pytest.mark.e2e
def test_with_the_defaults_every_rank_makes_the_same_collective_calls(tiny_ddp_run):
    """tests/conftest.py's tiny_ddp_run: evaluation before, at every step and after, W&B, a checkpoint per step."""
    assert_same_calls(tiny_ddp_run.record_dir)
    assert json.loads((tiny_ddp_run.run_dir / "summary.json").read_text())["processes"] == 2


@pytest.mark.e2e
def test_with_groups_left_out_and_the_prompt_shared_every_rank_makes_the_same_collective_calls(skip_ddp_run):
    """tests/conftest.py's skip_ddp_run: trainer.zero_variance_groups=skip, trainer.shared_prompt_forward=true."""
    assert_same_calls(skip_ddp_run.record_dir)
    assert json.loads((skip_ddp_run.run_dir / "summary.json").read_text())["processes"] == 2


@pytest.mark.e2e
def test_a_run_resumed_from_a_checkpoint_makes_the_same_calls_on_every_rank(tiny_ddp_run, tmp_path):
    checkpoint = tiny_ddp_run.run_dir / "trainer" / "checkpoint-3"
    assert (checkpoint / "trainer_state.json").is_file()
    resumed = recorded_launch(tmp_path, "trainer.max_steps=4", f"trainer.resume={checkpoint}")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert_same_calls(tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed_from"] == str(checkpoint)


@pytest.mark.e2e
def test_an_exception_on_one_rank_ends_every_rank_promptly_with_the_error_named(tmp_path):
    """The failing rank used to save a checkpoint on its way out: collectives with no partner (gloo paired them
    with the other rank's next call; NCCL hangs until the timeout)."""
    result = recorded_launch(
        tmp_path,
        "trainer.max_steps=4",
        "trainer.save_steps=1",
        "+trainer.extra.ddp_timeout=900",  # a hang would run into the subprocess's timeout below
        env={"GRPO_EXP_TEST_FAIL_RANK": "1:3"},
        timeout=300,
    )
    assert result.returncode != 0
    assert "injected failure on rank 1 at step 3" in result.stdout + result.stderr
    records = assert_same_calls(tmp_path, allow_early_end=True)
    assert not any("save_checkpoint" in call["site"] for call in records[1][-3:]), "the failing rank saved"
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "trainer").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"], "the last periodic checkpoint only (save_total_limit)"


@pytest.mark.e2e
def test_the_recorder_names_a_collective_called_on_one_rank_only(tmp_path):
    """The recorder's own check: rank 0 alone calls a barrier after its first step (the run then fails or hangs
    until the collectives' timeout); the records name the call."""
    result = recorded_launch(
        tmp_path,
        "eval.before=false",
        "eval.after=false",
        "+trainer.extra.ddp_timeout=10",
        env={"GRPO_EXP_TEST_EXTRA_COLLECTIVE": "0"},
        timeout=300,
    )
    assert result.returncode != 0
    problem = mismatch(read_records(tmp_path / "calls"), allow_early_end=True)
    assert problem is not None and "rank 0 made barrier" in problem, problem


def test_the_recorder_compares_calls_and_their_places():
    at = {"call": "all_gather", "site": "trl:grpo_trainer.py:1:a"}
    elsewhere = {"call": "all_gather", "site": "grpo_exp:experiment.py:2:b"}
    assert mismatch({0: [at, at], 1: [at, at]}) is None
    assert "rank 1 made all_gather (at grpo_exp" in mismatch({0: [at, at], 1: [at, elsewhere]})
    assert "rank 0 went on with all_gather" in mismatch({0: [at, at], 1: [at]})
    assert mismatch({0: [at, at], 1: [at]}, allow_early_end=True) is None
    assert "nothing to compare" in mismatch({0: [at]})


@pytest.mark.e2e
def test_a_dead_judge_endpoint_stops_every_rank_at_the_same_step_with_the_endpoint_named(tmp_path):
    """Every pair fails (nothing listens): past judge.max_failure_rate, counted over both processes' pairs, both
    stop at the first step, together, instead of training on the other rewards alone."""
    port = free_port()
    result = recorded_launch(
        tmp_path,
        "reward=math+format+judge",
        *stub_judge_overrides(port),  # nothing listens on the port (scores mode: a failed request is not retried)
        "eval.before=false",
        "+trainer.extra.ddp_timeout=900",
        timeout=300,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"the judge at judge.base_url=http://127.0.0.1:{port}/v1 (judge.model=stub) failed to score" in output
    # Each rank raises it, but the launcher ends the other rank as soon as one exits, which can be before that one
    # has printed (seen once in 4 runs of make test): both stopping at the same place is what the recorded calls
    # show (a rank that went on would have made a collective the other did not).
    assert output.count("more than judge.max_failure_rate=0.5") >= 1
    assert_same_calls(tmp_path)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not logged_steps(tmp_path / "run")


# Sharded training on CPU processes: DeepSpeed ZeRO (accelerate runs FSDP on GPUs only; see test_distributed.py).


@pytest.mark.e2e
# ZeRO-3 only: it shards the parameters too, so it covers what ZeRO-2 does (sharded gradients and optimiser state)
# and more; zero2.yaml's settings are read by tests/test_distributed.py
@pytest.mark.parametrize("config", ["zero3.yaml"])
def test_deepspeed_zero_on_two_cpu_processes_trains_evaluates_and_saves_as_ddp_does(tiny_ddp_run, tmp_path, config):
    """The shipped ZeRO configs (2 processes, no mixed precision on CPU): ZeRO-3 partitions the parameters from
    the start (zero.Init), so held-out evaluation before and after and the final save run on every process
    together. Same gradients as DDP's (tests/conftest.py's tiny_ddp_run: SPREAD, EVAL_SHARES), step by step, and
    the same calls on both processes."""
    zero = recorded_launch(
        tmp_path / "zero",
        *SPREAD,
        *EVAL_SHARES,
        accelerate_config=REPO_ROOT / "accelerate_configs" / config,
        launch_args=("--num_processes", "2", "--mixed_precision", "no"),
    )
    assert zero.returncode == 0, zero.stderr[-4000:]
    assert "shm_comm" not in zero.stdout + zero.stderr, "DeepSpeed compiled its inference-only CPU op"
    assert_same_calls(tmp_path / "zero")
    run_dir = tmp_path / "zero" / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and "3.2M parameters" in summary["model"], summary["model"]
    assert summary["heldout_accuracy_before"] is not None and summary["heldout_accuracy_after"] is not None
    assert len((run_dir / "eval_after.jsonl").read_text().splitlines()) == 5
    assert list((run_dir / "checkpoint-final").glob("*.safetensors"))
    assert list((run_dir / "checkpoint-best").glob("*.safetensors")), "saved from the shards, every process together"
    norms = [[m["grad_norm"] for m in logged_steps(d) if "grad_norm" in m] for d in (tiny_ddp_run.run_dir, run_dir)]
    assert len(norms[0]) == 3 and norms[0] == pytest.approx(norms[1], rel=1e-4)
    assert all(n > 0 for n in norms[0]), "groups with a spread: a real update"


@pytest.mark.e2e
def test_multi_turn_evaluation_under_zero3_runs_on_the_gathered_weights(tmp_path):
    """Evaluation generates on the policy as TRL does for its own generation: under ZeRO-3 with the weights gathered
    once, so that trajectories of different numbers of turns on the two processes need no common forwards."""
    result = recorded_launch(
        tmp_path,
        "rollout=multiturn",
        *EVAL_SHARES,
        accelerate_config=REPO_ROOT / "accelerate_configs" / "zero3.yaml",
        launch_args=("--num_processes", "2", "--mixed_precision", "no"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_calls(tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["heldout_accuracy_after"] is not None and "heldout_rollout_turns_mean_after" in summary, sorted(
        summary
    )


@pytest.mark.e2e
def test_under_two_processes_every_rank_raises_the_task_levels_together(tmp_path):
    """dataset.levels: both ranks validate on the same gathered answers, so both raise the levels at the same
    validation and draw the next step's prompts at the new level (samples.jsonl holds every rank's groups)."""
    result = recorded_launch(
        tmp_path,
        "dataset=reasoning_gym_mix",
        "dataset.eval_size=6",
        "dataset.train_size=12",
        "dataset.levels.enabled=true",
        "dataset.levels.top=1",
        "dataset.levels.threshold=0.0",
        "eval.every=1",
        "reward=task_score",
        "verifier.labels=task_score",
        "stats.table_every=1",
        "stats.table_groups=8",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_calls(tmp_path)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["task_level"] for s in samples} == {1}, "raised at the initial validation, on both ranks"
    assert len({s["group"] for s in samples if s["step"] == 1}) == 2, "both ranks' groups"
