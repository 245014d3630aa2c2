"""The project's Hydra config composed in-process (the CLI composes its own), and a test-sized run's overrides."""

from hydra import compose, initialize_config_dir

from grpo_exp.paths import CONF_DIR
from grpo_exp.run.config_store import register_schemas

# A test-sized training run: the tiny random model, two short steps, a small held-out split.
TINY_RUN = ["model=tiny", "trainer=debug", "dataset.eval_size=4", "dataset.train_size=64"]


def compose_config(overrides: list[str] | None = None):
    register_schemas()  # the config's structured schemas; idempotent, so no caller has to remember it
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides or [])


def resolved_config(overrides: list[str] | None = None):
    """The composed config through grpo_exp's resolve phase (every check a run makes), for one process: what the
    benchmarks measure is a configuration a run would accept. A grpo_exp.run.resolve.RunSpec."""
    from grpo_exp.run.resolve import resolve  # torch, transformers, TRL: not at import (conftest imports this module)

    return resolve(compose_config(overrides), processes=1)
