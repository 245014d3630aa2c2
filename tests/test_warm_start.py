"""The tests' warm start (tests/helpers/warm.py) goes cold only for a variable that a library may read at import: a
variable set at runtime by a library the tests import (deepspeed's) must not send every later command cold."""

import os
import signal
import sys
import time

import pytest

from tests.helpers import warm
from tests.helpers.warm import _search_path, same_imports

SERVER = {"PATH": "/usr/bin", "HOME": "/root"}


def test_variables_read_at_runtime_keep_a_command_warm():
    set_by_imports = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR", "_MLFLOW_TELEMETRY_SESSION_ID")
    for variable in (*set_by_imports, "FSDP_VERSION", "ACCELERATE_USE_FSDP", "RANK"):
        assert same_imports({**SERVER, variable: "1"}, SERVER), variable


def test_variables_that_change_imports_send_a_command_cold():
    for variable in ("HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "TRACKIO_DIR"):  # trackio's read at TRL's import
        assert not same_imports({**SERVER, variable: "x"}, SERVER), variable
    assert not same_imports({**SERVER, "PATH": "/elsewhere"}, SERVER)


def test_a_pythonpath_is_put_on_the_forks_search_path_as_a_new_interpreter_puts_it(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_environment.py").write_text("")
    # a directory without __init__.py named as an imported module (mkdocs' site/ beside the code: `site`) is at most
    # a namespace package, which never wins over a module of that name: every DDP test of a user's project went cold
    (project / "site").mkdir()
    (project / "site" / "index.html").write_text("")
    assert same_imports({**SERVER, "PYTHONPATH": str(project)}, SERVER)
    path = _search_path("/here", f"{project}{os.pathsep}", None)
    assert path[:2] == ["/here", str(project)] and path[2:] == [p for p in sys.path[1:] if p not in path[:2]]


def test_a_pythonpath_with_a_startup_hook_or_hiding_an_imported_module_sends_a_command_cold(tmp_path):
    hook, hiding, hiding_package = tmp_path / "hook", tmp_path / "hiding", tmp_path / "hiding_package"
    hook.mkdir()
    hiding.mkdir()
    (hiding_package / "json").mkdir(parents=True)
    (hook / "sitecustomize.py").write_text("")
    (hiding / "pytest.py").write_text("")  # a new interpreter would import this one, not the pytest already loaded
    (hiding_package / "json" / "__init__.py").write_text("")  # a regular package too
    for directory in (hook, hiding, hiding_package):
        assert not same_imports({**SERVER, "PYTHONPATH": str(directory)}, SERVER), directory


@pytest.mark.skipif(os.environ.get("GRPO_EXP_TEST_COLD") == "1", reason="GRPO_EXP_TEST_COLD=1: every command cold")
def test_the_server_starts_and_a_command_is_forked_from_it(tmp_path):
    """Else every command of the suite starts cold, each ~2 s of imports more, and no test would fail (a library
    printing at import before the server's "ready" once did that)."""
    server = warm._server()
    assert server is not None and server.ready
    (tmp_path / "parent_of_me.py").write_text("import os\nprint(os.getppid())\n")
    result = warm.run([sys.executable, "-m", "parent_of_me"], tmp_path, dict(os.environ), timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == server.process.pid


WAITS = "import pathlib, time\npathlib.Path('started').touch()\ntime.sleep(120)\n"


def signal_once_started(directory):
    def on_start(pid: int) -> None:
        deadline = time.monotonic() + 60
        while not (directory / "started").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pid, signal.SIGTERM)

    return on_start


@pytest.mark.parametrize("cold", [False, True])
def test_a_command_is_given_by_its_pid_while_it_runs_to_be_signalled(tmp_path, cold):
    """tests.helpers.cli.interrupted_when's SIGTERM (Slurm's at its time limit): warm or cold, `on_start` gets the
    running command's pid, and the result is the command's own."""
    (tmp_path / "waits.py").write_text(WAITS)
    env = {**os.environ, "READ_AT_IMPORT_BY_SOME_LIBRARY": "1"} if cold else dict(os.environ)
    began = time.monotonic()
    result = warm.run([sys.executable, "-m", "waits"], tmp_path, env, 300, signal_once_started(tmp_path))
    assert result.returncode == -signal.SIGTERM and time.monotonic() - began < 100


def test_when_on_start_fails_the_command_is_killed_and_the_next_one_runs(tmp_path):
    (tmp_path / "waits.py").write_text(WAITS)
    (tmp_path / "says.py").write_text("print('next')\n")

    def fails(pid: int) -> None:
        raise RuntimeError("the test gave up")

    with pytest.raises(RuntimeError, match="gave up"):
        warm.run([sys.executable, "-m", "waits"], tmp_path, dict(os.environ), 300, fails)
    result = warm.run([sys.executable, "-m", "says"], tmp_path, dict(os.environ), 60)
    assert (result.returncode, result.stdout) == (0, "next\n")
