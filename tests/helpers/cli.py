"""The command line in a fresh process, as a user runs it, and what a run wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

from grpo_exp.paths import REPO_ROOT


def run_cli(
    *args: str, module: str = "grpo_exp.train", timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def accelerate_launch(
    *args: str,
    accelerate_config: Path,
    module: str = "grpo_exp.train",
    timeout: int = 900,
    env: dict | None = None,
    launch_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file <accelerate_config> <launch_args> -m <module> <args>` from the repository's
    root, as a user starts several processes (`launch_args`: accelerate's own, over the config file's; `env`: added
    to this environment)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config), *launch_args]
    return subprocess.run(
        [*launch, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
    )


def logged_steps(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
