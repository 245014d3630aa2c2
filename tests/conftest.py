import copy
import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from grpo_exp.run.config_store import register_schemas
from support.config import TINY_RUN, compose_config
from support.environment import hub_offline, without_wandb_key
from support.test_tiers import xdist_groups
from tests.helpers import vllm_test_servers
from tests.helpers.cli import (
    CONFIDENCE_RUN,
    DDP,
    SKIP_SHARED_PROMPT,
    TINY_CLI_RUN,
    TINY_DDP_RUN,
    TINY_SWEEP,
    CliRun,
    recorded_launch,
    run_cli,
)


@pytest.hookimpl(tryfirst=True)  # its cleanup registered before pytest's unraisableexception's, so run after it
def pytest_configure(config):
    # No hub here: fail fast instead of retrying for half a minute. W&B never reaches its server in tests.
    # Set before any test module is collected, so before transformers and datasets read these at import.
    hub_offline()
    without_wandb_key()
    a_trackio_store_of_the_sessions(config)
    register_schemas()
    gc.disable()  # until the collection ends: its imports (torch, transformers, TRL) walked again and again otherwise
    # What the collection made is frozen when it ends (pytest_collection_finish), and unfrozen for the interpreter's
    # last collection, where extensions (nanobind's) report what it missed as leaked, but only after pytest's own two
    # at the session's end (unraisableexception's, in an unconfigure hook and a cleanup): frozen, those walk what the
    # tests made, not 1.4 s each over the imports (AVX2-only EPYC).
    config.add_cleanup(gc.unfreeze)


def a_trackio_store_of_the_sessions(config) -> None:
    """trackio reads where its store is (TRACKIO_DIR) when imported, and TRL imports it: a store of the session's own,
    set before the warm server starts (tests/helpers/warm.py), so that a run with logger=trackio starts warm
    (tests/test_trackers.py; another TRACKIO_DIR sends a command cold, a new interpreter's 27 CPU-s on 2 cores), and
    no test writes in the user's own store."""
    store = tempfile.mkdtemp(prefix="trackio_store_")
    os.environ["TRACKIO_DIR"] = store
    config.add_cleanup(lambda: shutil.rmtree(store, ignore_errors=True))


# The session's runs (below) that e2e tests in several files read.
SHARED_RUNS = {"tiny_cli_run", "tiny_sweep", "confidence_run", "tiny_ddp_run", "skip_ddp_run"}


@pytest.hookimpl(wrapper=True)  # around the plug-ins' own: xdist reads the groups in its (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """The e2e and slow tests in xdist groups (support/test_tiers.py runs them in workers): one per file, so that a
    module's fixture (a project, a trained model, test_vllm.py's servers) is made by one worker, and the files that
    read one of SHARED_RUNS in one group, so that one worker trains it. The in-process tier's tests are distributed
    one by one, as before."""
    grouped = [item for item in items if item.get_closest_marker("xdist_group") is None and is_e2e(item)]
    groups = xdist_groups([(item.path.name, set(item.fixturenames)) for item in grouped], SHARED_RUNS)
    for item, group in zip(grouped, groups, strict=True):
        item.add_marker(pytest.mark.xdist_group(group))
    return (yield)


def is_e2e(item) -> bool:
    return item.get_closest_marker("e2e") is not None or item.get_closest_marker("slow") is not None


def pytest_collection_finish(session):
    """What the imports and the collection made (torch, transformers, TRL, every test module) lives as long as the
    session: frozen out of the collector's sight, as the warm server does for commands (tests/helpers/warm.py) and
    a command for its imports (grpo_exp.import_collection), so that the full collection accelerate makes at every
    trainer's start (free_memory) and Python's own walk only what the tests made since."""
    gc.collect()
    gc.freeze()
    gc.enable()
    vllm_test_servers.start_early(session)  # tests/test_vllm.py's servers start now, overlapping the tests before it


def pytest_sessionfinish(session):
    vllm_test_servers.stop_early()


@pytest.fixture(autouse=True)
def environment_as_found():
    """Each test leaves the process's environment as it found it: what a library it ran set there (mlflow's
    tracking URI, W&B's run settings...) would reach every later test's configs, and send every later command cold
    (tests/helpers/warm.py: a variable the server was not started with)."""
    found = dict(os.environ)
    yield
    if os.environ != found:
        os.environ.clear()
        os.environ.update(found)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any attempt to load or build a model fails the test (a config mistake must be refused before)."""
    from transformers import AutoModelForCausalLM  # imports transformers: only after pytest_configure has run

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(AutoModelForCausalLM, "from_config", refuse)


@pytest.fixture
def tmp_run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


# ---- the composed config -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_config():
    """The composed config of a tiny run (TINY_RUN), composed once per session. Shared: read it, never change it
    (tests that change it take `cfg_train`)."""
    return compose_config(TINY_RUN)


@pytest.fixture
def cfg_train(tiny_config):
    """The composed config of a tiny run (TINY_RUN), the test's own copy to change: `cfg_train.trainer.beta = 0.1`
    where a test would compose `[*TINY_RUN, "trainer.beta=0.1"]` (a config group, `logger=none`, still needs
    compose_config)."""
    return copy.deepcopy(tiny_config)


# ---- the tiny model ------------------------------------------------------------------------------------------


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
def tiny_model_dir(tiny_model_dirs, tiny_config) -> Path:
    """The tiny model a tiny training run starts from (its weights drawn with trainer.seed)."""
    return tiny_model_dirs(tiny_config.trainer.seed)


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir, tiny_config):
    """The tiny random model, loaded as a trainer would load it (eval mode), with its tokenizer."""
    from transformers import AutoModelForCausalLM

    from grpo_exp.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, load_tokenizer(tiny_config.model, tiny_config.cache_dir)


# ---- tiny training runs through the command line, each trained once and read by several tests --------------


def _finished(directory: Path, *args: str, where: str = "hydra.run.dir") -> CliRun:
    """`python -m grpo_exp.train args` into `directory` (a run's, or a sweep's with hydra.sweep.dir), finished."""
    result = run_cli(*args, f"{where}={directory}")
    assert result.returncode == 0, result.stderr[-3000:]
    return CliRun(directory, result)


@pytest.fixture(scope="session")
def tiny_cli_run(tmp_path_factory) -> CliRun:
    """`python -m grpo_exp.train` with TINY_CLI_RUN, finished. Shared: read its directory; a test that writes into
    a run directory copies it (tests.helpers.cli.copied_run)."""
    return _finished(tmp_path_factory.mktemp("tiny_cli_run") / "run", *TINY_CLI_RUN)


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> CliRun:
    """`python -m grpo_exp.train` with TINY_SWEEP, finished: the sweep directory as `run_dir`. Shared: read it."""
    return _finished(tmp_path_factory.mktemp("tiny_sweep") / "sweep", *TINY_SWEEP, where="hydra.sweep.dir")


@pytest.fixture(scope="session")
def confidence_run(tmp_path_factory) -> CliRun:
    """`python -m grpo_exp.train` with CONFIDENCE_RUN, finished (test_validation.py, test_selfverify.py). Shared."""
    return _finished(tmp_path_factory.mktemp("confidence_run") / "run", *CONFIDENCE_RUN)


@pytest.fixture(scope="session")
def tiny_ddp_run(tmp_path_factory) -> CliRun:
    """TINY_DDP_RUN under `accelerate launch` (2 gloo processes), each rank's torch.distributed calls recorded
    (tests/helpers/recorded_run.py): the run in <dir>/run, the records in <dir>/calls. Shared: read it."""
    record_dir = tmp_path_factory.mktemp("tiny_ddp_run")
    result = recorded_launch(record_dir, *TINY_DDP_RUN, accelerate_config=DDP)
    assert result.returncode == 0, result.stderr[-4000:]
    return CliRun(record_dir / "run", result, record_dir)


@pytest.fixture(scope="session")
def skip_ddp_run(tmp_path_factory) -> CliRun:
    """SKIP_SHARED_PROMPT in a tiny run under `accelerate launch` (2 gloo processes, calls recorded as for
    tiny_ddp_run; test_collectives.py, test_distributed.py). Shared: read it."""
    record_dir = tmp_path_factory.mktemp("skip_ddp_run")
    result = recorded_launch(record_dir, *SKIP_SHARED_PROMPT, accelerate_config=DDP)
    assert result.returncode == 0, result.stderr[-4000:]
    return CliRun(record_dir / "run", result, record_dir)
