from pathlib import Path

import pytest

from grpo_exp.schema import register_schemas
from support.config import TINY_RUN, compose_config
from support.environment import hub_offline, without_wandb_key


def pytest_configure(config):
    # No hub here: fail fast instead of retrying for half a minute. W&B never reaches its server in tests.
    # Set before any test module is collected, so before transformers and datasets read these at import.
    hub_offline()
    without_wandb_key()
    register_schemas()


@pytest.fixture
def tmp_run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """The tiny random model with its tokenizer on disk, by the seed of its weights: `tiny_model_dirs(seed)`, each
    built once per session. Shared: load from it, never write into it."""
    from support.models import write_tiny_model  # imports transformers: only after pytest_configure has run

    built: dict[int, Path] = {}

    def directory(seed: int) -> Path:
        if seed not in built:
            built[seed] = write_tiny_model(tmp_path_factory.mktemp(f"tiny_seed{seed}"), seed)
        return built[seed]

    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_dirs) -> Path:
    """The tiny model a tiny training run starts from (its weights drawn with trainer.seed)."""
    return tiny_model_dirs(compose_config(TINY_RUN).trainer.seed)


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir):
    """The tiny random model, loaded as a trainer would load it (eval mode), with its tokenizer."""
    from transformers import AutoModelForCausalLM

    from grpo_exp.models import load_tokenizer

    cfg = compose_config(TINY_RUN)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), load_tokenizer(cfg.model, cfg.cache_dir)
