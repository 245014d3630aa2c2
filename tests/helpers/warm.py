"""Commands of the tests started warm: each is still a process of its own, forked from a server that has imported
torch, transformers, TRL and grpo_exp once, instead of importing them again (about 9 of the ~12 s of a tiny run on
2 cores).

The server (`python -m tests.helpers.warm`, started by the first command and kept for the session) only imports:
it computes nothing, and holds no thread, so a fork of it is as clean as a new interpreter that has read the same
modules. For each request it forks a child, which takes the request's working directory, environment and
arguments, runs the module as `python -m` does (runpy, as __main__), exits as Python exits (threads joined, atexit
handlers run) and leaves its stdout and stderr in files; the server waits for it, with the request's time limit.

A command goes cold (a new interpreter, `subprocess.run`) when its environment differs from the server's in a
variable that a library may read at import, when the server cannot start, or with GRPO_EXP_TEST_COLD=1 (to check
that the tests pass without it).
"""

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

# Variables that differ between the tests' calls and that nothing reads at import.
PER_CALL = {"PYTEST_CURRENT_TEST", "PWD", "OLDPWD", "COLUMNS", "LINES"}
IMPORTS = ("torch", "transformers", "trl", "datasets", "hydra", "grpo_exp.run.experiment", "grpo_exp.cli")
REPO_ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], cwd: Path | None, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`argv` (`python -m <module> ...` or a console script of this environment) as subprocess.run(capture_output,
    text) would run it: warm when it can, else cold."""
    request = _request(argv, cwd)
    server = _server() if request is not None else None
    if server is None or not server.same_imports(env):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return server.run(request, argv, timeout)


def _request(argv: list[str], cwd: Path | None) -> dict | None:
    """What the server runs: a module, the interpreter's sys.argv and sys.path[0], as `python -m` or the console
    script would have them; None for anything else."""
    directory = str(cwd or os.getcwd())
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return {"module": argv[2], "args": argv[3:], "argv0": argv[2], "path0": directory, "cwd": directory}
    script = Path(argv[0])
    if script.parent == Path(sys.executable).parent and script.name == "grpo-exp":
        path0 = str(script.parent)
        return {"module": "grpo_exp.cli", "args": argv[1:], "argv0": str(script), "path0": path0, "cwd": directory}
    return None


class Server:
    def __init__(self):
        self.env = {k: v for k, v in os.environ.items() if k not in PER_CALL}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.warm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=os.environ.copy(),
        )
        self.lock = threading.Lock()
        self.ready = self.process.stdout.readline().strip() == "ready"
        atexit.register(self.close)

    def same_imports(self, env: dict) -> bool:
        keys = (set(env) | set(self.env)) - PER_CALL
        return all(env.get(key) == self.env.get(key) for key in keys)

    def run(self, request: dict, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="warm-") as directory:
            out, err = Path(directory) / "stdout", Path(directory) / "stderr"
            request = {**request, "stdout": str(out), "stderr": str(err), "timeout": timeout}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self.process.stdout.readline())
            stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, reply["returncode"], stdout, stderr)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_SERVER: Server | None = None


def _server() -> Server | None:
    global _SERVER
    if os.environ.get("GRPO_EXP_TEST_COLD") == "1":
        return None
    if _SERVER is None or (_SERVER.ready and _SERVER.process.poll() is not None):  # never started, or it died
        _SERVER = Server()
    return _SERVER if _SERVER.ready else None  # one that could not start is not started again


# ---- the server ------------------------------------------------------------------------------------------------


def serve() -> None:
    import importlib

    for module in IMPORTS:
        importlib.import_module(module)
    if threading.active_count() != 1:  # a fork would copy a thread's locks, not the thread: go cold
        print(f"not ready: {threading.active_count()} threads after the imports", flush=True)
        return
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(_fork_and_wait(request)), flush=True)


def _fork_and_wait(request: dict) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request)  # never returns
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": False}
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"returncode": -signal.SIGKILL, "timed_out": True}
        time.sleep(0.05)


def _child(request: dict) -> None:
    """Become the command: its own process group (killed together at the time limit), its files for stdout and
    stderr, its directory and module search path; then exit as the interpreter would."""
    code = 1
    try:
        os.setpgid(0, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(file, fd)
            os.close(file)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        _leave_the_servers_exit_handlers()
        os.chdir(request["cwd"])
        sys.path[0] = request["path0"]
        sys.argv = [request["argv0"], *request["args"]]
        code = _main(request["module"])
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _leave_the_servers_exit_handlers() -> None:
    """What the server registered to run at exit is the server's: wandb removes its media directory, made at import,
    and the first child would remove it for every later one. The child keeps what a new interpreter's exit does
    for the objects it makes itself: logging's flush, multiprocessing's joins, weakref.finalize's handlers."""
    import logging
    import multiprocessing.util

    atexit._clear()
    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False
    atexit.register(logging.shutdown)
    atexit.register(multiprocessing.util._exit_function)
    atexit.register(weakref.finalize._exitfunc)


def _main(module: str) -> int:
    import runpy
    import traceback

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's exit: non-daemon threads joined, then the atexit handlers
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__":
    serve()
