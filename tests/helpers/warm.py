"""Commands of the tests started warm: each is still a process of its own, forked from a server that has imported
torch, transformers, TRL and grpo_exp once, instead of importing them again (about 9 of the ~12 s of a tiny run on
2 cores).

The server (`python -m tests.helpers.warm`, started by the first command and kept for the session) only imports:
it computes nothing, and holds no thread, so a fork of it is as clean as a new interpreter that has read the same
modules. It serves two kinds of request, one loop for both:
- a command of the tests (`run`), over its stdin: it forks a child, which takes the request's working directory,
  environment and arguments, runs the module as `python -m` does (runpy, as __main__), exits as Python exits
  (threads joined, atexit handlers run) and leaves its stdout and stderr in files; the reply comes when the child
  ends, or at the request's time limit, when the child's process group is killed;
- a rank of `accelerate launch` (`launch_module`): accelerate and torchrun start each rank as they always do, as
  `python -m tests.helpers.warm_rank <module> ...`, a stdlib-only client that hands the server its environment
  (RANK, MASTER_PORT, ...) and its stdin/stdout/stderr over a Unix socket. The server forks the rank with them; the
  client forwards the launcher's signals to it and exits with its status, so the launcher sees its own process.

A command goes cold (a new interpreter) when its environment differs from the server's in a variable that a library
may read at import, when the server cannot start, or with GRPO_EXP_TEST_COLD=1 (to check that the tests pass
without it).
"""

import atexit
import contextlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from support.run_imports import IMPORTS, OPTIONAL_IMPORTS, RUN_IMPORTS

# Variables that nothing reads at import: they may differ between the server and a command, which gets its own.
RUNTIME_VARIABLES = {
    "PYTEST_CURRENT_TEST", "PWD", "OLDPWD", "COLUMNS", "LINES", "_",
    "PYTHONPATH",  # put on the fork's sys.path as a new interpreter would (`_search_path`), where it can be
    # what accelerate launch and torchrun give each rank, read when the process group and the Accelerator start
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",  # applied with torch.set_num_threads: torch reads it only when its thread pool starts
    # set by `import deepspeed` (in the tests' own process, after the server started: every later command went
    # cold); torch reads it when asked whether CUDA is available
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    # set by importing peft (torch's inductor) and mlflow: a cache directory and a telemetry id, read when used
    "TORCHINDUCTOR_CACHE_DIR", "_MLFLOW_TELEMETRY_SESSION_ID",
}  # fmt: skip
# FSDP_: what accelerate launch gives each rank of an FSDP config, read when accelerate makes its FSDP plugin
RUNTIME_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "GRPO_EXP_TEST_", "FSDP_")
SOCKET_VARIABLE = "GRPO_EXP_TEST_WARM_SOCKET"
# Where a command's environment names a file here, the server appends its CPU account there when it ends: the CPU
# of the commands it forks, which no test's process waits for (support/cpu_profile.py reads it).
CPU_LOG_VARIABLE = "GRPO_EXP_TEST_CPU_LOG"
REPO_ROOT = Path(__file__).resolve().parents[2]


def run(
    argv: list[str], cwd: Path | None, env: dict, timeout: float, on_start: Callable[[int], None] | None = None
) -> subprocess.CompletedProcess:
    """`argv` (`python -m <module> ...` or a console script of this environment) as subprocess.run(capture_output,
    text) would run it: warm when it can, else cold. `on_start`: called with the command's pid once it runs (to
    signal it), in the tests' process while the command runs; should it raise, the command is killed."""
    request = _request(argv, cwd, env)
    server = _server() if request is not None else None
    if server is None or not same_imports(env, server.env):
        if on_start is None:
            return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        return _cold_started(argv, cwd, env, timeout, on_start)
    return server.run(request, argv, timeout, on_start)


def _cold_started(
    argv: list[str], cwd: Path | None, env: dict, timeout: float, on_start: Callable[[int], None]
) -> subprocess.CompletedProcess:
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        on_start(process.pid)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def alive(pid: int) -> bool:
    """Whether the process `pid` has not ended (a command's, until its parent has reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def launch_module(module: str) -> list[str]:
    """What to give `accelerate launch -m` for `module`'s ranks to start warm (cold with GRPO_EXP_TEST_COLD=1)."""
    return [module] if os.environ.get("GRPO_EXP_TEST_COLD") == "1" else ["tests.helpers.warm_rank", module]


def same_imports(env: dict, imported_with: dict, set_by_imports: frozenset = frozenset()) -> bool:
    keys = (set(env) | set(imported_with)) - set_by_imports
    if env.get("PYTHONPATH") != imported_with.get("PYTHONPATH") and not _search_path_warm(env.get("PYTHONPATH")):
        return False
    return all(env.get(key) == imported_with.get(key) for key in keys if not _at_runtime(key))


def _search_path_warm(pythonpath: str | None) -> bool:
    """Whether a fork can take this $PYTHONPATH as a new interpreter would (its entries put on sys.path): not where
    an entry has a startup hook, or a top-level module that an already imported one of that name would hide."""
    for entry in _entries(pythonpath):
        if not os.path.isdir(entry):
            continue
        names = {path.name.split(".")[0] for path in Path(entry).iterdir() if _importable(path)}
        if names & {"sitecustomize", "usercustomize"}:
            return False
        for name in names & set(sys.modules):
            where = getattr(sys.modules[name], "__file__", None) or ""
            if not where.startswith(entry + os.sep):
                return False
    return True


def _importable(path: Path) -> bool:
    """A module or regular package a search path entry would give: a .py file, an extension, or a directory with an
    __init__.py. A directory without one (docs/, or mkdocs' site/ in the repository's root) is at most a namespace
    package, which loses to a module of its name anywhere on the path: it never hides one already imported."""
    return (path / "__init__.py").is_file() if path.is_dir() else path.suffix in (".py", ".pyc", ".so")


def _entries(pythonpath: str | None) -> list[str]:
    """$PYTHONPATH's entries as a new interpreter puts them on sys.path: absolute (site.removeduppaths)."""
    return [os.path.abspath(entry) for entry in (pythonpath or "").split(os.pathsep) if entry]


def _search_path(path0: str, pythonpath: str | None, imported_with: str | None) -> list[str]:
    """sys.path as a new interpreter would have it: the module's directory, $PYTHONPATH, then the rest."""
    servers = set(_entries(imported_with))
    rest = [entry for entry in sys.path[1:] if entry not in servers]
    return list(dict.fromkeys([path0, *_entries(pythonpath), *rest]))


def _at_runtime(variable: str) -> bool:
    return variable in RUNTIME_VARIABLES or variable.startswith(RUNTIME_PREFIXES)


def _request(argv: list[str], cwd: Path | None, env: dict) -> dict | None:
    """What the server runs: a module, the interpreter's sys.argv and sys.path[0], as `python -m` or the console
    script would have them; None for anything else."""
    directory = str(cwd or os.getcwd())
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        request = {"module": argv[2], "args": argv[3:], "argv0": argv[2], "path0": directory}
    elif Path(argv[0]).parent == Path(sys.executable).parent and Path(argv[0]).name == "grpo-exp":
        request = {"module": "grpo_exp.cli", "args": argv[1:], "argv0": argv[0], "path0": str(Path(argv[0]).parent)}
    else:
        return None
    return {**request, "cwd": directory, "env": env}


class Server:
    def __init__(self):
        self.env = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.warm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=os.environ.copy(),
        )
        self.lock = threading.Lock()
        self.ready = self._started()
        atexit.register(self.close)

    def _started(self) -> bool:
        """Whether the server said "ready": lines its imports printed before are passed over (deepspeed's)."""
        for line in self.process.stdout:
            if line.strip() == "ready" or line.startswith("not ready"):
                return line.strip() == "ready"
        return False

    def run(
        self, request: dict, argv: list[str], timeout: float, on_start: Callable[[int], None] | None = None
    ) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="warm-") as directory:
            out, err = Path(directory) / "stdout", Path(directory) / "stderr"
            request = {**request, "stdout": str(out), "stderr": str(err), "timeout": timeout}
            request["announce"] = on_start is not None  # the server says the command's pid as it starts it
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            if on_start is not None:
                self._started_command(on_start)
            reply = json.loads(self.process.stdout.readline())
            stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, reply["returncode"], stdout, stderr)

    def _started_command(self, on_start: Callable[[int], None]) -> None:
        pid = json.loads(self.process.stdout.readline())["pid"]
        try:
            on_start(pid)
        except BaseException:
            Loop.kill(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # not yet the leader of its own group
            self.process.stdout.readline()  # its reply, once reaped: the next command reads its own
            raise

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


class Loop:
    """The server's one thread: the tests' commands over stdin (one at a time), ranks over the socket (any number),
    children reaped as they end."""

    def __init__(self, listener: socket.socket, imported_with: dict):
        self.listener = listener
        self.imported_with = imported_with
        # what the libraries put in the environment as they were imported (mlflow, torch): a new interpreter's
        # imports would set them too, so a command has them beside its own environment
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in imported_with}
        self.command: tuple[int, float] | None = None  # the command's pid and deadline
        self.timed_out = False
        self.ranks: dict[int, socket.socket] = {}  # a rank's pid -> its client's connection
        self.accounts: dict[int, dict] = {}  # a forked pid -> what its CPU account says, where one is asked for

    def serve(self) -> None:
        stdin_open = True
        while stdin_open or self.command or self.ranks:
            watched = [self.listener, *self.ranks.values()] + ([sys.stdin] if stdin_open else [])
            for source in select.select(watched, [], [], 0.05)[0]:
                if source is sys.stdin:
                    line = sys.stdin.readline()
                    stdin_open = bool(line)
                    if line:
                        self.start_command(json.loads(line))
                elif source is self.listener:
                    self.start_rank(self.listener.accept()[0])
                elif not source.recv(16):  # a client that went away takes its rank with it
                    self.kill(next(pid for pid, conn in self.ranks.items() if conn is source))
            self.reap()
            if self.command and time.monotonic() > self.command[1]:  # at the time limit: it, and any rank
                self.timed_out = True
                for pid in [self.command[0], *self.ranks]:
                    self.kill(pid)
            if not stdin_open and self.command is None:
                for pid in self.ranks:
                    self.kill(pid)

    def start_command(self, request: dict) -> None:
        files = [os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for name in ("stdout", "stderr")]
        stdin = os.open(os.devnull, os.O_RDONLY)
        pid = self.fork(request, [stdin, *files])
        self.open_account(pid, request)
        self.command, self.timed_out = (pid, time.monotonic() + request["timeout"]), False
        if request.get("announce"):
            print(json.dumps({"pid": pid}), flush=True)

    def start_rank(self, conn: socket.socket) -> None:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(message)
        if len(fds) != 3 or not same_imports(request["env"], self.imported_with, frozenset(self.set_by_imports)):
            for fd in fds:
                os.close(fd)
            conn.send(json.dumps({"cold": True}).encode())
            conn.close()
            return
        pid = self.fork(request, fds)
        self.open_account(pid, request)
        conn.send(json.dumps({"pid": pid}).encode())
        self.ranks[pid] = conn

    def fork(self, request: dict, fds: list[int]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            for conn in self.ranks.values():
                conn.close()
            environment = {**self.set_by_imports, **request["env"]}
            _child({**request, "env": environment, "server_pythonpath": self.imported_with.get("PYTHONPATH")}, fds)
        for fd in fds:
            os.close(fd)
        return pid

    def open_account(self, pid: int, request: dict) -> None:
        if request["env"].get(CPU_LOG_VARIABLE):
            command = [request["module"], *request["args"]]
            self.accounts[pid] = {
                "log": request["env"][CPU_LOG_VARIABLE],
                "started": time.monotonic(),
                "record": {"test": request["env"].get("PYTEST_CURRENT_TEST", ""), "command": " ".join(command)[:300]},
            }

    def close_account(self, pid: int, usage: resource.struct_rusage) -> None:
        """The ended process's CPU (its own and its waited-for children's: a launcher's ranks are the server's)."""
        account = self.accounts.pop(pid, None)
        if account is not None:
            cpu = usage.ru_utime + usage.ru_stime
            wall = time.monotonic() - account["started"]
            with contextlib.suppress(OSError), open(account["log"], "a") as log:  # an aid: never the tests' failure
                record = {**account["record"], "cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}
                record |= {"sys_s": round(usage.ru_stime, 2), "minflt": usage.ru_minflt}
                log.write(json.dumps(record) + "\n")

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.close_account(pid, usage)
            code = os.waitstatus_to_exitcode(status)
            if self.command and pid == self.command[0]:
                self.command = None
                print(json.dumps({"returncode": code, "timed_out": self.timed_out}), flush=True)
            elif pid in self.ranks:
                conn = self.ranks.pop(pid)
                try:
                    conn.send(json.dumps({"returncode": code}).encode())
                except OSError:
                    pass  # its client is gone
                conn.close()

    @staticmethod
    def kill(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve() -> None:
    import importlib
    import importlib.util

    from grpo_exp.import_collection import without_collection

    imported_with = dict(os.environ)
    # What the imports made lives as long as the server: imported without the collector, then frozen out of its
    # sight, so that a collection in a child (one at every training's start: accelerate's free_memory) walks only the
    # child's own objects, 0.5 s -> 1 ms.
    with without_collection():
        for module in (*IMPORTS, *RUN_IMPORTS):
            importlib.import_module(module)
        for module in OPTIONAL_IMPORTS:
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
    if threading.active_count() != 1:  # a fork would copy a thread's locks, not the thread: go cold
        print(f"not ready: {threading.active_count()} threads after the imports", flush=True)
        return
    directory = tempfile.mkdtemp(prefix="warm-ranks-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(os.path.join(directory, "socket"))
    listener.listen(16)
    loop = Loop(listener, imported_with)
    os.environ[SOCKET_VARIABLE] = listener.getsockname()  # for the ranks of the launchers it forks
    print("ready", flush=True)
    try:
        loop.serve()
    finally:
        listener.close()
        os.unlink(os.path.join(directory, "socket"))
        os.rmdir(directory)


def _child(request: dict, fds: list[int]) -> None:
    """Become the command: its own process group (killed together), its stdin/stdout/stderr, environment, directory
    and module search path; then exit as the interpreter would."""
    code = 1
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _leave_the_servers_exit_handlers()
        server_socket = os.environ[SOCKET_VARIABLE]
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[SOCKET_VARIABLE] = server_socket  # for the ranks of a launcher it starts
        if "OMP_NUM_THREADS" in os.environ:
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if request.get("unbuffered"):
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(write_through=True)
        os.chdir(request["cwd"])
        sys.path[:] = _search_path(request["path0"], os.environ.get("PYTHONPATH"), request["server_pythonpath"])
        sys.argv = [request["argv0"], *request["args"]]
        from grpo_exp.process_exit import leave

        leave(_main(request["module"]))  # the interpreter's exit: threads joined, atexit handlers, output flushed
    finally:  # the child never got to run its command
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

    from grpo_exp.process_exit import exit_status

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = exit_status(stop)
    except BaseException:  # as the interpreter: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    return code


if __name__ == "__main__":
    from grpo_exp.process_exit import run_then_exit

    run_then_exit(serve)  # its imports not torn down at the end either: the tests' session waits for it (seconds)
