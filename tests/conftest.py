import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from grpo_exp.paths import CONF_DIR
from grpo_exp.schema import register_schemas

# No hub here: fail fast instead of retrying for half a minute. W&B never reaches its server in tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.pop("WANDB_API_KEY", None)
register_schemas()


def compose_config(overrides: list[str] | None = None):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides or [])


def logged_steps(run_dir: Path) -> list[dict]:
    """Every line of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


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


@pytest.fixture
def tmp_run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


# A test-sized training run: the tiny random model, two short steps, a small held-out split.
TINY_RUN = ["model=tiny", "trainer=debug", "dataset.eval_size=4", "dataset.train_size=64"]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """The tiny random model, saved and loaded as a trainer would load it (eval mode), with its tokenizer."""
    from transformers import AutoModelForCausalLM

    from grpo_exp.models import build_tiny_model, load_tokenizer

    cfg = compose_config([*TINY_RUN])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model_dir = tmp_path_factory.mktemp("tiny")
    build_tiny_model(cfg.model, tokenizer, cfg.trainer.seed).save_pretrained(model_dir)
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer
