"""The python tool: a snippet run in a fresh interpreter with time, memory and output limits and no network.

Layers, outermost first:
- a child process in its own session, killed (with its group) at the wall-clock limit; CPU time, address
  space, written file size and process count are capped with setrlimit;
- an isolated interpreter (-I -S: no environment, no user site, no current directory on the path) in an empty
  temporary directory;
- a CPython audit hook, installed before the snippet runs and not removable from Python, that refuses imports
  of os / sys-level modules (socket, subprocess, ctypes, ...) and the events behind process creation, networking
  and writing or deleting files, whatever route the snippet takes to them.
This stops a policy's snippets (loops, huge output, `import os`, sockets), not a determined human attacker:
run untrusted code from people in a container or VM.
"""

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpo_exp.config_rules import OnlyWith
from grpo_exp.rollout.tools.result import ToolResult

# Runs inside the child: the snippet is sys.argv[1].
BOOTSTRAP = r"""
import sys


def install_guard():
    # Everything the guard uses lives in this closure (immutable values), out of the snippet's reach.
    import os

    blocked_modules = frozenset({
        "os", "posix", "nt", "socket", "_socket", "ssl", "select", "selectors", "subprocess", "_posixsubprocess",
        "multiprocessing", "_multiprocessing", "threading", "_thread", "ctypes", "_ctypes", "signal", "resource",
        "shutil", "pathlib", "tempfile", "glob", "importlib", "pty", "fcntl", "mmap", "asyncio", "http", "urllib",
        "ftplib", "smtplib", "telnetlib", "webbrowser", "sqlite3", "pickle", "marshal", "gc",
    })
    # Reading stays allowed (the import system lists and opens files), inside the Python installation only.
    blocked_events = (
        "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
        "os.remove", "os.rmdir", "os.rename", "os.chmod", "os.chown", "os.mkdir", "os.symlink", "os.link",
        "os.truncate", "os.putenv", "os.unsetenv", "os.utime", "os.setxattr", "os.removexattr", "os.chflags",
        "subprocess.", "socket.", "ctypes.", "shutil.", "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.",
        "sqlite3.", "pty.", "fcntl.", "mmap.", "sys._getframe", "sys._current_frames", "sys.setprofile",
        "sys.settrace", "code.__new__",
    )
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    # Not /proc (the parent's environment holds API keys), not home directories.
    readable_roots = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    realpath = os.path.realpath

    def readable(path):
        if isinstance(path, int):  # an already open descriptor (the standard streams)
            return True
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        return isinstance(path, str) and realpath(path).startswith(readable_roots)

    def guard(event, args):
        if event == "import":
            if args[0].partition(".")[0] in blocked_modules:
                raise ImportError(f"import of {args[0]!r} is not allowed in the python tool")
        elif event == "open":
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & write_flags):
                raise PermissionError("writing files is not allowed in the python tool")
            if not readable(args[0]):
                raise PermissionError("reading files is not allowed in the python tool")
        elif event in ("os.listdir", "os.scandir") and not readable("." if args[0] is None else args[0]):
            raise PermissionError("listing directories is not allowed in the python tool")
        elif event.startswith(blocked_events):
            raise PermissionError(f"{event} is not allowed in the python tool")

    # What a calculation needs, imported before the guard (some import os; what they hold of it still meets
    # the guard's events).
    for name in ("math", "cmath", "fractions", "decimal", "random", "statistics", "itertools", "functools",
                 "collections", "operator", "string", "re", "heapq", "bisect", "numbers"):
        __import__(name)
    # Modules loaded at start-up would import silently: unload the blocked ones so that `import` asks the guard.
    for name in list(sys.modules):
        if name.partition(".")[0] in blocked_modules:
            del sys.modules[name]
    sys.addaudithook(guard)


code = compile(sys.argv[1], "<snippet>", "exec")
install_guard()
del install_guard
exec(code, {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0
    memory_mb: int = 256
    max_output_chars: int = 400


def run_python(snippet: str, limits: SandboxLimits = SandboxLimits()) -> ToolResult:
    """Run a snippet; what it printed, or why it failed (a time limit, an exception, a refused import...)."""
    output_bytes = 64 * limits.max_output_chars  # written beyond this, the child is killed (SIGXFSZ)

    def limit_child() -> None:
        cpu = max(1, int(limits.timeout_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
        memory = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no fork (ignored for root; the audit hook still refuses)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    with tempfile.TemporaryDirectory(prefix="grpo_exp_tool_") as workdir:
        stdout_path, stderr_path = Path(workdir) / ".stdout", Path(workdir) / ".stderr"
        with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", BOOTSTRAP, snippet],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                cwd=workdir,
                env={},
                preexec_fn=limit_child,
                start_new_session=True,
            )
            try:
                code = process.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                code = None
        printed = _read(stdout_path, limits.max_output_chars)
        failure = _read(stderr_path, 100 * limits.max_output_chars)
    if code in (None, -signal.SIGXCPU, -signal.SIGKILL):
        return ToolResult(f"error: time limit of {limits.timeout_s:g} s exceeded", True)
    if code == -signal.SIGXFSZ:
        return ToolResult(f"error: output limit exceeded; printed: {printed[:100]}", True)
    if code != 0:
        lines = failure.strip().splitlines()
        return ToolResult(f"error: {lines[-1] if lines else f'exit status {code}'}", True)
    if len(printed) >= limits.max_output_chars:
        printed = printed[: limits.max_output_chars] + "... (truncated)"
    return ToolResult(printed.strip() or "(no output: print the result)", False)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _read(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit + 1).decode("utf-8", errors="replace")


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("rollout.python",),
        lambda cfg: "python" in cfg.rollout.tools,
        "by the python tool's sandbox",
        lambda cfg: f"rollout.tools={list(cfg.rollout.tools)} has no python",
        "add python to rollout.tools",
    ),
)
