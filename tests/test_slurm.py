"""Several processes per job through submitit (hydra/launcher=slurm_multigpu): one task per GPU, one process group.

No Slurm here: submitit's local executor starts a job's tasks the way Slurm does (each with its task numbers in
submitit's variables), so a 2-task CPU job rehearses the multi-GPU preset's code path end to end.
"""

import json
import os
import socket

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from grpo_exp.paths import CONF_DIR
from grpo_exp.run.cluster import export_torch_distributed_env
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import STATUS_FILE
from support.config import TINY_RUN
from tests.helpers.cli import run_cli

TORCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def job_env():
    """os.environ as a submitit task would see it: `job_env(**variables)`; restored afterwards."""
    saved = dict(os.environ)
    for name in (*TORCH_VARIABLES, "SUBMITIT_EXECUTOR"):
        os.environ.pop(name, None)

    def enter(**variables: str) -> None:
        os.environ.update(variables)

    yield enter
    os.environ.clear()
    os.environ.update(saved)


def local_task(rank: int, tasks: int = 2) -> dict:
    """What submitit's LocalExecutor (submitit/local/local.py) sets for task `rank` of a one-node job."""
    return {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "4242",  # the job controller's pid
        "SUBMITIT_LOCAL_NTASKS": str(tasks),
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_GLOBALID": str(rank),
        "SUBMITIT_LOCAL_LOCALID": str(rank),
    }


def torch_variables() -> dict:
    return {name: os.environ.get(name) for name in TORCH_VARIABLES}


def test_a_local_two_task_job_becomes_a_two_process_group(job_env):
    seen = []
    for rank in (0, 1):
        job_env(**local_task(rank))
        assert export_torch_distributed_env()
        seen.append(torch_variables())
        for name in TORCH_VARIABLES:
            del os.environ[name]
    assert [(v["RANK"], v["LOCAL_RANK"]) for v in seen] == [("0", "0"), ("1", "1")]
    assert {(v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"], v["MASTER_ADDR"]) for v in seen} == {
        ("2", "2", socket.gethostname())
    }
    assert len({v["MASTER_PORT"] for v in seen}) == 1, "both tasks derive the same port from the job id"


def test_a_two_node_slurm_task_finds_the_first_node_and_keeps_its_gpus(job_env):
    job_env(
        SUBMITIT_EXECUTOR="slurm",
        SLURM_JOB_ID="777",
        SLURM_NTASKS="16",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NODEID="1",
        SLURM_JOB_NODELIST="gpu[017-018]",
        SLURM_PROCID="9",
        SLURM_LOCALID="1",
        MASTER_PORT="29511",  # a port the user chose is kept
        CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
    )
    assert export_torch_distributed_env()
    assert torch_variables() == {
        "MASTER_ADDR": "gpu017",
        "MASTER_PORT": "29511",
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
    }
    # accelerate takes GPU LOCAL_RANK of the visible ones (PartialState.set_device); submitit would narrow this
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    "situation",
    [
        {},  # not in a submitit job
        local_task(0, tasks=1),  # a one-task job: a plain single-process run
        {**local_task(1), "RANK": "1", "WORLD_SIZE": "4"},  # torchrun/accelerate inside the job set them up
    ],
    ids=["no job", "one task", "set by a launcher"],
)
def test_nothing_is_set_outside_a_multi_task_job(job_env, situation):
    job_env(**situation)
    before = torch_variables()
    assert not export_torch_distributed_env()
    assert torch_variables() == before


def test_the_multigpu_preset_runs_one_task_per_gpu():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        overrides = ["hydra/launcher=slurm_multigpu", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=4"]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        launcher = instantiate(cfg.hydra.launcher)  # as Hydra builds it: the parameters submitit receives
    assert type(launcher).__name__ == "SlurmLauncher"
    assert launcher.params["tasks_per_node"] == launcher.params["gpus_per_node"] == 4
    assert launcher.params["partition"] == "gpu" and launcher.params["nodes"] == 1


@pytest.mark.e2e
def test_a_two_task_submitit_job_trains_as_one_run_with_two_processes(tmp_path):
    """slurm_multigpu's path with submitit's local executor: 2 tasks of one job (CPU, gloo), as Slurm would start.
    Also the one test of hydra/launcher=submitit_local and submitit_slurm's shared path: the job pickled, submitted,
    run and its result collected (a sweep of several jobs is Hydra's, tested with the joblib launcher)."""
    result = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        "hydra.launcher.gpus_per_node=0",
        "hydra.launcher.timeout_min=15",
        *TINY_RUN,
        "trainer.max_steps=2",
        "eval.before=false",
        "logger=none",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    results = sorted(p.name.split("_", 1)[1] for p in (tmp_path / ".submitit").rglob("*_result.pkl"))
    assert results == ["0_result.pkl", "1_result.pkl"], "one job, two tasks, each returned"
    [run_dir] = [p.parent for p in tmp_path.rglob("summary.json")]
    assert [p.name for p in tmp_path.iterdir() if p.name.isdigit()] == ["0"] and run_dir == tmp_path / "0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 2
    steps = [m["step"] for m in read_metrics(run_dir / "metrics.jsonl") if "reward" in m]
    assert steps == [1, 2], "metrics written once per step (by rank 0)"
    assert json.loads((run_dir / STATUS_FILE).read_text())["status"] == "finished"
