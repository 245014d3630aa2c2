"""The command line in a fresh process, as a user runs it, and what a run wrote."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_exp.paths import REPO_ROOT
from support.config import TINY_RUN
from tests.helpers import warm

DDP = REPO_ROOT / "accelerate_configs" / "ddp.yaml"

# The tiny run that tests/conftest.py's `tiny_cli_run` trains once for the tests that read it: a reward spread
# (`length`: random completions are scored apart, so the advantages and the gradients are not zero), W&B (offline:
# no API key in tests), held-out evaluation before and after, and the resumable checkpoint of every step kept.
TINY_CLI_RUN = [
    *TINY_RUN,
    "reward=math+format+length",
    "logger=wandb",
    "trainer.save_steps=1",
    "trainer.save_total_limit=2",
    "trainer.keep_checkpoints=true",
]

# For the embedded model where a test reads no weights: its final model (517 MB) and the resume checkpoint that TRL
# writes at the last step (1.5 GB with the optimizer state) stay off the disk, which both test tiers share.
NO_SAVED_WEIGHTS = ["save_model=false", "trainer.save_steps=0"]

# What the zero variants are compared against: a reward spread, groups kept, three steps, validation at every step.
SPREAD = ["reward=math+format+length", "trainer.zero_variance_groups=keep", "trainer.max_steps=3", "eval.every=1"]
EVAL_SHARES = ["dataset.eval_size=5", "eval.batch_size=2"]  # uneven shares: one process repeats a batch
# The 2-process DDP run that tests/conftest.py's `tiny_ddp_run` trains once (TINY_RUN under tests.helpers.recorded_run):
# SPREAD and EVAL_SHARES, W&B (the main process only), the checkpoint of every step kept (to resume from).
TINY_DDP_RUN = [
    *SPREAD,
    *EVAL_SHARES,
    "logger=wandb",
    "trainer.save_steps=1",
    "trainer.keep_checkpoints=true",
    "trainer.mismatch_metrics=true",
]
# The 2-process run that leaves groups without spread out, the prompt read once per group: `skip_ddp_run`.
SKIP_SHARED_PROMPT = ["trainer.zero_variance_groups=skip", "trainer.shared_prompt_forward=true"]

# The confidence reward (a frozen generative verifier, the tiny model) in a tiny run validated at every step, the
# best two validations' models kept: tests/conftest.py's `confidence_run`.
CONFIDENCE_RUN = [
    *TINY_RUN,
    "reward=math+confidence",
    "scorer=genrm",
    "scorer.model=tiny",
    "reward.components.confidence.show=solution",  # the random tiny model never writes a final answer
    "eval.every=1",
    "eval.every_samples=2",
    "eval.best_metric=heldout/confidence/mean",  # the random model is never right: its accuracy always ties
    "eval.keep_top_k=2",
    "logger=none",
]

# Two tiny jobs (G = 2 and 3, three steps each) run in parallel by the joblib launcher: tests/conftest.py's
# `tiny_sweep` (test_sweeps.py's launcher test, test_compare.py's tools on a real sweep).
TINY_SWEEP = [
    "-m",
    "hydra/launcher=joblib",
    "hydra.launcher.n_jobs=2",
    *TINY_RUN,
    "reward=math+format+length",
    "logger=none",
    "trainer.num_generations=2,3",
    "trainer.max_steps=3",
]


@dataclass(frozen=True)
class CliRun:
    """A finished run: its directory, the command's result, and (under tests.helpers.recorded_run) the records."""

    run_dir: Path
    result: subprocess.CompletedProcess
    record_dir: Path | None = None

    @property
    def console(self) -> str:
        return self.result.stdout + self.result.stderr


def copied_run(run: CliRun, destination: Path) -> Path:
    """A copy of a shared run's directory, for a test that writes into it."""
    return Path(shutil.copytree(run.run_dir, destination))


def run_cli(
    *args: str, module: str = "grpo_exp.train", timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> <args>`, its output captured (tests/helpers/warm.py: forked from a warm interpreter when
    its environment allows)."""
    return warm.run([sys.executable, "-m", module, *args], None, {**os.environ, **(env or {})}, timeout)


def interrupted_when(args: list[str], done: Callable[[], bool]) -> subprocess.CompletedProcess:
    """`python -m grpo_exp.train <args>` sent SIGTERM (what Slurm sends at its time limit) as soon as `done()`; it
    must not have ended before. Started warm where it can (tests/helpers/warm.py), as run_cli is."""

    def interrupt(pid: int) -> None:
        deadline = time.monotonic() + 300
        while not done():
            if not warm.alive(pid):
                return  # ended before the point to stop at: said below, with its output
            assert time.monotonic() < deadline, "the point to stop at was never reached"
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):  # ended just now: its status says so, as Popen.send_signal's
            os.kill(pid, signal.SIGTERM)

    result = warm.run([sys.executable, "-m", "grpo_exp.train", *args], None, dict(os.environ), 600, interrupt)
    assert done(), f"the run ended before the point to stop at: {result.stderr[-3000:]}"
    return result


def run_command(
    argv: list, cwd: Path | None = None, timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`argv` (`python -m <module> ...` or `grpo-exp ...`) from `cwd`, its output captured, as subprocess.run would
    run it (tests/helpers/warm.py: forked from a warm interpreter when its environment allows)."""
    return warm.run([str(a) for a in argv], cwd, {**os.environ, **(env or {})}, timeout)


def accelerate_launch(
    *args: str,
    accelerate_config: Path,
    module: str = "grpo_exp.train",
    timeout: int = 900,
    env: dict | None = None,
    launch_args: tuple[str, ...] = (),
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file <accelerate_config> <launch_args> -m <module> <args>` from the repository's
    root (or `cwd`: a user's project, whose modules the run imports from there), as a user starts several processes
    (`launch_args`: accelerate's own, over the config file's; `env`: added to this environment)."""
    from support.servers import free_port  # imports transformers: only after conftest's pytest_configure has run

    if not any(arg.startswith("--main_process_port") for arg in launch_args):  # tests run side by side (xdist)
        launch_args = ("--main_process_port", str(free_port()), *launch_args)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config), *launch_args]
    # the launcher and its ranks start warm (tests/helpers/warm.py): accelerate and torchrun start each rank as
    # `python -m tests.helpers.warm_rank <module> ...`, which the warm server forks
    argv = [*launch, "-m", *warm.launch_module(module), *args]
    environment = {**os.environ, **(env or {})}
    if cwd is not None:  # the ranks' command (tests.helpers.warm_rank) is imported from the repository
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    return warm.run(argv, cwd or REPO_ROOT, environment, timeout)


def logged_steps(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def recorded_launch(
    record_dir: Path,
    *overrides: str,
    env: dict | None = None,
    timeout: int = 600,
    accelerate_config: Path = DDP,
    launch_args: tuple[str, ...] = (),
):
    """A tiny run (TINY_RUN; logger=none unless `overrides` name one) in <record_dir>/run under accelerate launch,
    each rank's torch.distributed calls recorded in <record_dir>/calls (tests/helpers/recorded_run.py)."""
    logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger=none"]
    return accelerate_launch(
        str(record_dir / "calls"),
        *TINY_RUN,
        *logger,
        f"hydra.run.dir={record_dir / 'run'}",
        *overrides,
        accelerate_config=accelerate_config,
        module="tests.helpers.recorded_run",
        timeout=timeout,
        env=env,
        launch_args=launch_args,
    )
