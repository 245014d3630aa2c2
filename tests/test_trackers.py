"""logger=trackio | tensorboard | mlflow. End to end: a 2-run sweep of the tiny model through the command line, read
back with each tracker's own reader: TRL's metrics and grpo_exp's own (group statistics, held-out validation at
every step, reward histograms, sample tables, the summary), both runs in one group, no secret anywhere in the store;
and trackio's dashboard in a real headless browser. In-process: what each backend writes of grpo_exp's media, and
the configuration's errors."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hydra.errors import CompactHydraException

from grpo_exp.run import trackers
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import REDACTED, Tracker
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli

SECRET = "sk-do-not-log-4242"
# Validation at every step (heldout/accuracy at steps 0, 1, 2), a sample table at every step, and a secret in the
# config (TRL's hub_token: redacted in ours, masked in TrainingArguments' dump) that no store may contain.
SWEEP = [*TINY_RUN, "eval.every=1", "stats.table_every=1", f"+trainer.extra.hub_token={SECRET}", "trainer.seed=1,2"]
NAMES = ["trainer.seed=1", "trainer.seed=2"]
TRL_METRIC, OUR_METRIC = "reward", "groups/reward/group_std/mean"


def run_sweep(sweep_dir: Path, logger: str, *overrides: str, env: dict | None = None) -> None:
    result = run_cli("-m", *SWEEP, f"logger={logger}", f"hydra.sweep.dir={sweep_dir}", *overrides, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


def sweep_group(sweep_dir: Path) -> str:
    return sweep_dir.as_posix()[-128:]  # run_identity's group of a sweep outside the working directory


def assert_no_secret(directory: Path) -> None:
    leaked = [p for p in directory.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the secret was written to {leaked}"


# ---- trackio -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trackio_sweep(tmp_path_factory) -> tuple[Path, Path]:
    """(sweep dir, trackio store) of a finished 2-run sweep with logger=trackio, in the session's store
    (tests/conftest.py: this module's runs alone write there)."""
    sweep = tmp_path_factory.mktemp("trackio") / "sweep"
    run_sweep(sweep, "trackio")
    return sweep, Path(os.environ["TRACKIO_DIR"])


def trackio_cli(store: Path, *args: str) -> dict:
    """trackio's own reader of its local store: `trackio <args> --json`."""
    command = [str(Path(sys.executable).parent / "trackio"), *args, "--json"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TRACKIO_DIR": str(store)})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.mark.e2e
def test_trackio_store_holds_the_sweep_as_one_group_with_trl_and_grpo_exp_metrics(trackio_sweep):
    sweep_dir, store = trackio_sweep
    assert sorted(trackio_cli(store, "list", "runs", "--project", "grpo_exp")["runs"]) == NAMES
    for name in NAMES:
        run = trackio_cli(store, "get", "run", "--project", "grpo_exp", "--run", name)
        assert run["config"]["_Group"] == run["config"]["group"] == sweep_group(sweep_dir)
        assert run["config"]["trainer.seed"] == int(name[-1])  # flat: the dashboard groups runs by any key
        assert run["config"]["trainer.extra.hub_token"] == REDACTED
        # TRL's callback prefixes train/; grpo_exp's media and summary go in under their own names
        for metric in (f"train/{TRL_METRIC}", f"train/{OUR_METRIC}", "train/heldout/accuracy"):
            assert metric in run["metrics"], metric
        for metric in ("groups/reward_mean_hist", "groups/reward_std_hist", "groups/samples"):
            assert metric in run["metrics"], metric
        assert "summary/heldout_accuracy_after" in run["metrics"]
    heldout = trackio_cli(
        store, "get", "metric", "--project", "grpo_exp", "--run", NAMES[0], "--metric", "train/heldout/accuracy"
    )
    assert [point["step"] for point in heldout["values"]] == [0, 1, 2]  # at the optimisation step (0: before)
    assert_no_secret(store)


def launch_browser(playwright):
    """Headless Chromium: the system's (`make browser` installs Debian's), else one `playwright install` fetched;
    the test skips, saying why, when there is neither."""
    from playwright.sync_api import Error

    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    executable = next((path for name in names if (path := shutil.which(name))), None)
    try:
        return playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
    except Error as err:
        reason = str(err).splitlines()[0]
        pytest.skip(f"no browser for the dashboard (`make browser` installs Debian's chromium): {reason}")


@contextmanager
def trackio_dashboard(store: Path, project: str):
    """`trackio show` on a free port, serving the store; yields the project's page."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        f"import trackio; trackio.show(project={project!r}, open_browser=False, block_thread=True, server_port={port})"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TRACKIO_DIR": str(store)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/?project={project}"
    try:
        deadline = time.monotonic() + 300  # gradio's imports: a few seconds alone, minutes beside both tiers' workers
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "the dashboard did not answer in 300 s"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.e2e
def test_trackio_dashboard_shows_both_runs_and_the_heldout_curve(trackio_sweep, tmp_path):
    from playwright.sync_api import sync_playwright

    sweep_dir, store = trackio_sweep
    screenshot = tmp_path / "trackio_dashboard.png"
    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        with trackio_dashboard(store, "grpo_exp") as url:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url)
            for name in NAMES:  # both runs listed...
                page.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
            page.get_by_label("Group by").click()
            page.get_by_role("option", name="group", exact=True).click()
            page.get_by_text(sweep_group(sweep_dir), exact=True).wait_for()  # ...as one group, the sweep
            page.locator("input[placeholder*='ndcg']").fill("heldout/accuracy|train/reward$|group_std/mean$")
            curve = page.locator('[data-metric="train/heldout/accuracy"]')
            curve.locator("canvas").first.wait_for(timeout=30_000)  # the held-out curve, drawn...
            assert sorted(curve.locator(".legend-label").all_inner_texts()) == NAMES  # ...for each run
            page.wait_for_timeout(1000)  # the charts' last redraw
            page.screenshot(path=str(screenshot))
        browser.close()
    assert screenshot.stat().st_size > 10_000


# ---- TensorBoard ---------------------------------------------------------------------------------------------


def tensorboard_runs(logdir: Path) -> dict[str, object]:
    """What `tensorboard --logdir <logdir>` shows: every run directory under it, read by TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.io_wrapper import GetLogdirSubdirectories

    runs = {}
    for directory in GetLogdirSubdirectories(str(logdir)):
        accumulator = EventAccumulator(directory, size_guidance={"tensors": 0, "histograms": 0, "scalars": 0})
        runs[Path(directory).relative_to(logdir).as_posix()] = accumulator.Reload()
    return runs


def text(accumulator, tag: str) -> list[str]:
    return [event.tensor_proto.string_val[0].decode() for event in accumulator.Tensors(f"{tag}/text_summary")]


@pytest.mark.e2e
def test_tensorboard_logdir_of_a_sweep_has_a_run_per_job_with_trl_and_grpo_exp_metrics(tmp_path):
    sweep_dir = tmp_path / "sweep"
    run_sweep(sweep_dir, "tensorboard")
    runs = tensorboard_runs(sweep_dir)
    assert sorted(runs) == [f"0/tensorboard/{NAMES[0]}", f"1/tensorboard/{NAMES[1]}"]
    for accumulator in runs.values():
        for metric in (TRL_METRIC, OUR_METRIC):
            assert [e.step for e in accumulator.Scalars(f"train/{metric}")] == [1, 2]
        assert [e.step for e in accumulator.Scalars("train/heldout/accuracy")] == [0, 1, 2]
        assert accumulator.Scalars("summary/heldout_accuracy_after")
        for histogram in ("groups/reward_mean_hist", "groups/reward_std_hist"):
            assert [e.step for e in accumulator.Histograms(histogram)] == [1, 2]
        samples = text(accumulator, "groups/samples")
        assert len(samples) == 2 and "| completion |" in samples[0]
        assert json.loads(textwrap.dedent(text(accumulator, "run")[0]))["group"] == sweep_group(sweep_dir)
        assert REDACTED in text(accumulator, "config")[0]
    for job in ("0", "1"):
        assert_no_secret(sweep_dir / job / "tensorboard")


# ---- MLflow --------------------------------------------------------------------------------------------------


def mlflow_client(store: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{store / 'mlflow.db'}")


@pytest.mark.e2e
def test_mlflow_store_holds_the_sweep_as_one_experiment_with_trl_and_grpo_exp_metrics(tmp_path):
    sweep_dir, store = tmp_path / "sweep", tmp_path / "mlflow"
    run_sweep(sweep_dir, "mlflow", f"logger.tracking_uri={store}")
    client = mlflow_client(store)
    experiment = client.get_experiment_by_name(f"grpo_exp/{sweep_group(sweep_dir).lstrip('/')}")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == NAMES
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["grpo_exp.group"] == sweep_group(sweep_dir) and run.data.tags["model"] == "tiny"
        assert run.data.params["trainer.seed"] == run.info.run_name[-1]
        assert run.data.params["trainer.extra.hub_token"] == REDACTED
        history = {k: sorted(m.step for m in client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}
        assert history[TRL_METRIC] == history[OUR_METRIC] == [1, 2]
        assert history["heldout/accuracy"] == [0, 1, 2]
        assert "summary/heldout_accuracy_after" in history
        samples = json.loads(
            Path(client.download_artifacts(run.info.run_id, "groups/samples.json", tmp_path)).read_text()
        )
        steps = [row[samples["columns"].index("step")] for row in samples["data"]]
        assert "completion" in samples["columns"] and sorted(set(steps)) == [1, 2]
    assert_no_secret(store)


# ---- in-process: each backend's media, the configuration ----------------------------------------------------


class Logger:
    """The fields of LoggerSchema a backend reads."""

    def __init__(self, backend: str, **fields):
        from grpo_exp.schema import LoggerBackend, WandbMode

        self.backend, self.mode, self.project, self.entity, self.tags = (
            LoggerBackend(backend),
            WandbMode.auto,
            "p",
            None,
            ["baseline"],
        )
        self.tracking_uri = fields.get("tracking_uri")


def log_media(tracker: Tracker) -> None:
    run = tracker.run
    run.log_histograms(1, {"groups/reward_mean_hist": np.array([0.0, 0.5, 0.5, 1.0])})
    rows = [{"step": 1, "completion": "a | b\nc", "correct": None, "turn_advantages": [0.5, 0.5]}]
    run.log_table(1, "groups/samples", rows)
    tracker.summary({"steps": 1, "heldout_accuracy_after": 0.25})
    tracker.finish(failed=False)


CONFIG = {"judge": {"api_key": SECRET}, "trainer": {"beta": 0.04}}


def test_tensorboard_run_writes_histograms_tables_config_and_summary(tmp_path):
    tracker = Tracker(Logger("tensorboard"), tmp_path, "trainer.beta=0.04", "sweep", ["model:tiny"], CONFIG)
    log_media(tracker)
    [(name, accumulator)] = tensorboard_runs(tmp_path).items()
    assert name == "tensorboard/trainer.beta=0.04" and tracker.identity()["tensorboard_dir"].endswith(name)
    assert [e.step for e in accumulator.Histograms("groups/reward_mean_hist")] == [1]
    assert text(accumulator, "groups/samples") == [
        "| step | completion | correct | turn_advantages |\n|---|---|---|---|\n| 1 | a \\| b<br>c |  | [0.5, 0.5] |"
    ]
    assert [(e.step, e.value) for e in accumulator.Scalars("summary/heldout_accuracy_after")] == [(1, 0.25)]
    assert REDACTED in text(accumulator, "config")[0]
    assert_no_secret(tmp_path)


def test_mlflow_run_writes_params_tags_tables_and_summary_to_a_local_store(monkeypatch, tmp_path):
    # mlflow.set_tracking_uri also sets $MLFLOW_TRACKING_URI: restored after the test, which later configs would read
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "mlflow"
    logger = Logger("mlflow", tracking_uri=str(store))
    tracker = Tracker(logger, tmp_path, "trainer.beta=0.04", None, ["model:tiny"], CONFIG, run_id="earlier")
    log_media(tracker)
    client = mlflow_client(store)
    run = client.get_run(tracker.identity()["mlflow_run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "p"  # not a sweep: the project's experiment
    assert run.info.status == "FINISHED" and run.info.run_name == "trainer.beta=0.04"
    assert run.data.params == {"judge.api_key": REDACTED, "trainer.beta": "0.04"}
    assert {"model": "tiny", "baseline": "", "grpo_exp.resumed_from": "earlier"}.items() <= run.data.tags.items()
    assert run.data.metrics == {"summary/steps": 1.0, "summary/heldout_accuracy_after": 0.25}
    samples = json.loads(Path(client.download_artifacts(run.info.run_id, "groups/samples.json", tmp_path)).read_text())
    assert samples == {
        "columns": ["step", "completion", "correct", "turn_advantages"],
        "data": [[1, "a | b\nc", None, "[0.5, 0.5]"]],
    }
    assert json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", tmp_path)).read_text()) == {
        "judge": {"api_key": REDACTED},
        "trainer": {"beta": 0.04},
    }
    assert_no_secret(store)


def test_mlflow_stores_under_the_outputs_dir_unless_the_environment_names_a_tracking_uri(monkeypatch, tmp_path):
    from grpo_exp.run.trackers.mlflow_run import tracking_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert compose_config(["logger=mlflow", "outputs_dir=/runs"]).logger.tracking_uri == "/runs/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert compose_config(["logger=mlflow", "outputs_dir=/runs"]).logger.tracking_uri == "http://mlflow:5000"
    assert tracking_store("http://mlflow:5000") == ("http://mlflow:5000", None)
    # a directory: a local SQLite store in it, artifacts beside
    assert tracking_store(str(tmp_path / "mlflow")) == (
        f"sqlite:///{tmp_path}/mlflow/mlflow.db",
        (tmp_path / "mlflow" / "artifacts").as_uri(),
    )


def test_a_missing_tracker_library_is_one_message_naming_the_logger(monkeypatch, tmp_path):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(CompactHydraException, match=r"logger=mlflow needs mlflow: pip install mlflow-skinny"):
        resolve(compose_config([*TINY_RUN, "logger=mlflow"]), trainer_dir=tmp_path)  # before any model loads


def test_a_long_run_name_is_one_directory_name():
    from grpo_exp.run.trackers.tensorboard_run import directory_name

    assert (
        directory_name("model.name_or_path=/models/x,trainer.beta=0.04")
        == "model.name_or_path=_models_x,trainer.beta=0.04"
    )
    long = ",".join(f"reward.components.math.weight={i}" for i in range(10))
    assert len(directory_name(long)) == 120 and directory_name(long) != directory_name(long + "0")


def test_a_tracking_uri_mlflow_refuses_is_one_message_naming_the_key(tmp_path, monkeypatch):
    from grpo_exp.errors import UserError

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    file_store = (tmp_path / "mlruns").as_uri()  # MLflow 3.17's file store: refused unless MLFLOW_ALLOW_FILE_STORE
    with pytest.raises(UserError, match=f"logger.tracking_uri={file_store}: The filesystem tracking backend"):
        Tracker(Logger("mlflow", tracking_uri=file_store), tmp_path, "defaults", None, [], {})
