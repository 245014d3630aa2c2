"""Multi-process training with accelerate (CPU, gloo), and the GPU engines' configs (DeepSpeed, FSDP, vLLM)."""

import importlib.util
import json
import math
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType

from grpo_exp.data_parallel import batches_of
from grpo_exp.errors import UserError
from grpo_exp.paths import REPO_ROOT
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import BENCHMARK_FILE
from grpo_exp.trainer.config import check_trainer, ddp_timeout, grpo_exp_config
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import EVAL_SHARES, accelerate_launch, run_cli

ACCELERATE_DIR = REPO_ROOT / "accelerate_configs"


@pytest.mark.e2e
def test_two_processes_train_data_parallel_and_only_the_main_one_writes(tiny_ddp_run):
    """tests/conftest.py's tiny_ddp_run: 3 steps of the tiny model on 2 processes, W&B offline."""
    run_dir = tiny_ddp_run.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    # 2 prompts x G=2 per step in total: one group's worth of completions on each of the two processes
    assert summary["processes"] == 2 and summary["per_device_train_batch_size"] == 2 and summary["steps"] == 3
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1, "only the main process logs to W&B"
    logged = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in logged] == [1, 2, 3], "metrics written once per step (by the main process)"
    assert (run_dir / "checkpoint-final" / "model.safetensors").is_file()
    # the sampler/trainer mismatch of both processes' completions (trainer.mismatch_metrics=true), default path
    assert all(0.0 <= m["sampling/sampling_logp_difference/mean"] < 1e-4 for m in logged)


@pytest.mark.e2e
def test_a_waiting_process_gives_up_after_the_configured_timeout_not_torchs_default():
    """The process group is joined with the run's ddp_timeout (GRPOConfig's field): a rank waiting on a main
    process that is away longer gives up then, not after torch's default of tens of minutes."""
    result = accelerate_launch(
        "5", accelerate_config=ACCELERATE_DIR / "ddp.yaml", module="tests.helpers.waiting_rank", timeout=300
    )
    output = result.stdout + result.stderr
    gave_up = re.search(r"gave up after (\d+) s", output)
    assert gave_up, output[-3000:]
    assert int(gave_up.group(1)) < 15, "the main process slept 20 s: the waiting one must not have waited it out"


def test_the_collectives_timeout_is_the_runs_ddp_timeout():
    assert ddp_timeout(compose_config(["+trainer.extra.ddp_timeout=7"]).trainer) == timedelta(seconds=7)
    assert ddp_timeout(compose_config().trainer) == timedelta(seconds=1800)  # GRPOConfig's default
    assert ddp_timeout(compose_config(["+trainer.extra.ddp_timeout=soon"]).trainer) == timedelta(seconds=1800)


@pytest.mark.e2e
def test_two_processes_with_the_defaults_train_when_only_one_process_has_a_group_with_spread(tmp_path):
    """A step where one process keeps its group and the other leaves its own out (skip, the default): TRL gathers
    per-row metrics, so both must hand it as many rows; this aborted at the first such step (gloo: collective
    mismatch). Every step is such a step here: one group per process, and a reward with a spread on the first
    process only (tests/helpers/rank_rewards.py)."""
    result = accelerate_launch(
        *TINY_RUN,
        "reward=math",
        "+reward.components.rigged.function=tests.helpers.rank_rewards:spread_on_the_first_process",
        "+reward.components.rigged.weight=1",
        "trainer.max_steps=2",
        "eval.before=false",
        "eval.after=false",
        "logger=none",
        f"hydra.run.dir={tmp_path}",
        accelerate_config=ACCELERATE_DIR / "ddp.yaml",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [m for m in read_metrics(tmp_path / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2], "every step, written once"
    assert [m["zero_variance/groups_left_out"] for m in steps] == [1.0, 1.0], "one group of two left out"
    assert all(m["grad_norm"] > 0 for m in steps), "the kept group trained"
    assert json.loads((tmp_path / "summary.json").read_text())["processes"] == 2


@pytest.mark.e2e
def test_each_process_makes_the_models_copy_with_its_weights_in_an_empty_cache(tmp_path):
    """Each process of a run makes the model's copy when its cache has none, and the first to finish publishes it.
    transformers writes a model's files from rank 0 alone once torch.distributed is up, so the other rank's copy held
    the tokenizer but no config or weights, and, quicker to make, was often the one published: that run failed, and
    every later run on the cache with it ('Unrecognized model'). Here each rank has a cache of its own (a node's
    local disk), so rank 1's copy is its own to make, whatever the timing. The caches start with the tokenizer's copy
    alone (reading the GGUF again would add seconds and test nothing here)."""
    from grpo_exp.models import load_model, load_tokenizer

    cfg = compose_config(TINY_RUN)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)  # the session's copy of the tokenizer, made if missing
    caches = [tmp_path / f"cache{rank}" for rank in (0, 1)]
    for cache in caches:
        shutil.copytree(Path(cfg.cache_dir).expanduser() / "tokenizers", cache / "tokenizers")
    result = accelerate_launch(
        *TINY_RUN,
        f"cache_dir={tmp_path}/cache${{oc.env:RANK}}",
        "trainer.max_steps=1",
        "eval.before=false",
        "eval.after=false",
        "logger=none",
        "save_model=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        accelerate_config=ACCELERATE_DIR / "ddp.yaml",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for cache in caches:
        (copy,) = (cache / "models").iterdir()  # one copy published, no build left behind
        assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in copy.iterdir()}
        assert load_model(cfg.model, tokenizer, str(cache), seed=cfg.trainer.seed).name_or_path == str(copy)


@pytest.mark.e2e
def test_every_process_takes_the_verification_benchmark_the_main_process_finds_in_its_cache(tmp_path):
    """Whether the cache holds the run's verification benchmark is the main process's answer, for every process:
    each deciding for itself, a process whose cache lacked it (a node's own disk; a file another job wrote between
    two processes' looks) built it alone, its collectives without a partner. Here rank 0's cache holds it (a run of
    one process made it) and rank 1's does not."""
    benchmark = ["eval.verification_benchmark.enabled=true", "eval.verification_benchmark.problems=4"]
    quiet = ["trainer.max_steps=1", "eval.after=false", "logger=none", "save_model=false"]
    made = run_cli(
        *TINY_RUN, *benchmark, *quiet, f"cache_dir={tmp_path / 'cache0'}", f"hydra.run.dir={tmp_path / 'one'}"
    )
    assert made.returncode == 0, made.stderr[-4000:]
    shutil.copytree(tmp_path / "cache0", tmp_path / "cache1", ignore=shutil.ignore_patterns("verification_benchmark"))
    result = accelerate_launch(
        *TINY_RUN,
        *benchmark,
        *quiet,
        "+trainer.extra.ddp_timeout=60",  # a process left without its partner fails in a minute, not half an hour
        f"cache_dir={tmp_path}/cache${{oc.env:RANK}}",
        f"hydra.run.dir={tmp_path / 'two'}",
        accelerate_config=ACCELERATE_DIR / "ddp.yaml",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Verification benchmark from the cache" in (tmp_path / "two" / "train.log").read_text()
    assert not (tmp_path / "cache1" / "verification_benchmark").exists(), "rank 1 built nothing, wrote nothing"
    one, two = (json.loads((tmp_path / run / BENCHMARK_FILE).read_text()) for run in ("one", "two"))
    assert two == one


@pytest.mark.e2e
def test_every_process_resumes_the_attempt_the_main_process_finds(tmp_path):
    """trainer.resume=auto: the earlier attempt is the main process's find, for every process. Each looking for
    itself, a process that saw other files (a node's own disk; an attempt written between two processes' looks, the
    main process's own run directory among them) went its own way: here rank 1, its outputs_dir empty, trained afresh
    while rank 0, its outputs_dir holding the run finished, reported it, their collectives without a partner."""
    run = [*TINY_RUN, "trainer.max_steps=1", "eval.after=false", "logger=none", "save_model=false"]
    run += ["+trainer.extra.ddp_timeout=60"]  # a process left without its partner fails in a minute
    first_dir = tmp_path / "outputs0" / "first"
    first = run_cli(*run, f"outputs_dir={tmp_path / 'outputs0'}", f"hydra.run.dir={first_dir}")
    assert first.returncode == 0, first.stderr[-4000:]
    result = accelerate_launch(
        *run,
        "trainer.resume=auto",
        f"outputs_dir={tmp_path}/outputs${{oc.env:RANK}}",
        f"hydra.run.dir={tmp_path / 'two'}",
        accelerate_config=ACCELERATE_DIR / "ddp.yaml",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "already finished" in result.stdout + result.stderr
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["resumed_from"] == str(first_dir)
    assert not (tmp_path / "two" / "trainer").exists(), "no process trained"


@pytest.mark.e2e
def test_a_refusal_of_what_the_main_process_reads_for_all_is_raised_on_every_process():
    """What the main process alone reads for every process (grpo_exp.data_parallel.from_main_process: the judge's
    statistics, the cached verification benchmark, the attempt to resume), where it refuses the user's input, each
    process raises the refusal. The others used to wait for the main process in a collective it never made, and fail
    there ('Connection closed by peer'), or, under a launcher that stops no process when another fails, wait until
    the collectives' timeout."""
    from tests.helpers.refusing_rank import REFUSAL

    result = accelerate_launch(
        "60", accelerate_config=ACCELERATE_DIR / "ddp.yaml", module="tests.helpers.refusing_rank", timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} raised: {REFUSAL}" in result.stdout, result.stdout[-2000:]


@pytest.mark.e2e
def test_two_processes_leave_out_groups_without_spread_and_read_prompts_once(skip_ddp_run):
    """The tiny model's groups never have a spread: every step leaves all of them out, and each process still goes
    through DDP's forward and backward (one row, times 0) so that the gradients are reduced together
    (tests/conftest.py's skip_ddp_run: 2 steps, groups without spread skipped, the prompt shared)."""
    steps = [m for m in read_metrics(skip_ddp_run.run_dir / "metrics.jsonl") if "reward" in m]
    assert [m["zero_variance/groups_left_out"] for m in steps] == [2.0, 2.0]
    assert all(m["grad_norm"] == 0.0 for m in steps)


@pytest.mark.parametrize(
    ("name", "kind", "detail"),
    [
        ("ddp.yaml", DistributedType.MULTI_GPU, {}),
        ("zero2.yaml", DistributedType.DEEPSPEED, {"zero_stage": 2}),
        ("zero3.yaml", DistributedType.DEEPSPEED, {"zero_stage": 3, "zero3_save_16bit_model": True}),
        ("fsdp.yaml", DistributedType.FSDP, {"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"}),
    ],
)
def test_the_accelerate_configs_are_valid_for_accelerate(name, kind, detail):
    """Checked by accelerate's own loader (running DeepSpeed and FSDP needs GPUs: see docs/scale-out.md)."""
    config = load_config_from_file(str(ACCELERATE_DIR / name))
    assert config.distributed_type == kind and config.num_machines == 1
    section = config.deepspeed_config if kind == DistributedType.DEEPSPEED else config.fsdp_config
    assert detail.items() <= section.items()


def test_the_batch_must_split_evenly_over_the_processes(cfg_train):
    cfg_train.trainer.prompts_per_step = cfg_train.trainer.num_generations = 3
    with pytest.raises(UserError, match="9 completions per step cannot be split evenly over 2 processes"):
        check_trainer(cfg_train.trainer, 2, multiturn=False, policy_dtype=torch.float32)
    # 3 completions per process (the 2-process run above checks what TRL derives)
    check_trainer(cfg_train.trainer, 3, multiturn=False, policy_dtype=torch.float32)


@pytest.mark.parametrize("option", ["vllm_colocate", "vllm_server"])
def test_vllm_generation_is_a_config_switch_for_trl(option):
    cfg = compose_config([*TINY_RUN, f"generation={option}"])
    args = grpo_exp_config(cfg.trainer, Path("unused"), "none", [1.0, 0.2], False)
    assert args.use_vllm and args.vllm_mode == option.removeprefix("vllm_")
    if importlib.util.find_spec("vllm") is None:  # without vLLM: refused before any model loads, saying how to install
        with pytest.raises(UserError, match="grpo-exp\\[vllm\\]"):
            check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)
    else:  # vLLM's CPU build here, CUDA's on a GPU: accepted
        check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)


def test_generation_defaults_to_transformers(cfg_train):
    assert not grpo_exp_config(cfg_train.trainer, Path("unused"), "none", [1.0, 0.2], False).use_vllm


@pytest.mark.parametrize("processes", [1, 2, 3, 8])
@pytest.mark.parametrize(("count", "batch_size"), [(0, 4), (1, 4), (5, 2), (100, 16), (7, 1)])
def test_evaluation_shares_are_whole_batches_that_cover_every_item_once(count, batch_size, processes):
    shares = [batches_of(count, batch_size, rank, processes) for rank in range(processes)]
    assert [i for indices, _ in shares for i in indices] == list(range(count)), "each item once, in order"
    assert all(indices.start % batch_size == 0 for indices, _ in shares if len(indices)), "as one process batches"
    runs = {batches for _, batches in shares}
    assert len(runs) == 1, "every process runs as many batches"
    assert runs.pop() == max(math.ceil(len(indices) / batch_size) for indices, _ in shares)


@pytest.mark.e2e
def test_two_processes_evaluate_a_share_each_and_answer_as_one_process_does(tiny_ddp_run, tmp_path):
    """Held-out evaluation runs on every process, each answering whole batches (5 problems in batches of 2: one
    process answers 2 batches, the other 1 and repeats one, as a sharded model needs); greedy answers, gathered,
    are those of a one-process run (tests/conftest.py's tiny_ddp_run: EVAL_SHARES, beside a one-process run)."""
    alone = run_cli(*TINY_RUN, *EVAL_SHARES, "trainer.max_steps=1", "logger=none", f"hydra.run.dir={tmp_path}")
    assert alone.returncode == 0, alone.stderr[-4000:]
    for when in ("before", "after"):
        samples = [(run / f"eval_{when}.jsonl").read_text().splitlines() for run in (tmp_path, tiny_ddp_run.run_dir)]
        assert len(samples[1]) == 5
        if when == "before":  # the same initial weights (training differs: one process's batch is not DDP's)
            assert samples[0] == samples[1]
    summary = json.loads((tiny_ddp_run.run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["heldout_accuracy_after"] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="accelerate runs FSDP on GPUs")
def test_fsdp_on_cpu_processes_is_refused_since_accelerate_would_train_them_as_ddp(monkeypatch, cfg_train):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserError, match=r"FSDP \(accelerate_configs/fsdp.yaml\) needs GPUs.*zero3.yaml"):
        check_trainer(cfg_train.trainer, 1, multiturn=False, policy_dtype=torch.float32)


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="accelerate runs FSDP on GPUs")
def test_the_fsdp_config_on_cpu_processes_stops_before_training_with_the_alternatives_named(tmp_path):
    result = accelerate_launch(
        *TINY_RUN,
        "logger=none",
        f"hydra.run.dir={tmp_path}",
        accelerate_config=ACCELERATE_DIR / "fsdp.yaml",
        launch_args=("--num_processes", "2", "--mixed_precision", "no"),
        timeout=300,
    )
    assert result.returncode != 0
    assert "FSDP (accelerate_configs/fsdp.yaml) needs GPUs" in result.stderr
    # the message, not our stack trace (the launcher prints its own when a process fails)
    assert f'File "{REPO_ROOT / "src"}' not in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_rank_whose_clock_named_another_run_directory_logs_in_the_shared_one_and_leaves_none_behind(tmp_path):
    """Ranks started a second apart compose different run directories from the clock: the later one's log goes on
    in the main process's directory (train.rank1.log, its first lines moved with it) and its own directory goes."""
    import logging

    from grpo_exp.run.distributed import leave_own_run_dir

    own, shared = tmp_path / "18-27-41", tmp_path / "18-27-40"
    (own / ".hydra").mkdir(parents=True)
    (own / ".hydra" / "config.yaml").write_text("{}")
    shared.mkdir()
    handler = logging.FileHandler(own / "train.log", mode="w")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        root.warning("before the broadcast")
        leave_own_run_dir(own, shared, rank=1)
        root.warning("after it")
    finally:
        root.removeHandler(handler)
        handler.close()
    assert not own.exists() and (shared / "train.rank1.log").read_text() == "before the broadcast\nafter it\n"
