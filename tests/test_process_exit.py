"""grpo_exp.process_exit: a command ends as the interpreter's exit would (threads joined, atexit handlers run, output
flushed, the status SystemExit gives), without tearing its modules down."""

import os
import subprocess
import sys
import textwrap

import pytest

# stdout block-buffered, as a command's is into a pipe or a file (a PYTHONUNBUFFERED=1 environment writes through)
BUFFERED = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}

COMMAND = """
import atexit, threading, time
from grpo_exp.process_exit import run_then_exit

class Module:
    def __del__(self):
        print("torn down")  # printed only when the interpreter tears the modules down

module_object = Module()

def late():
    time.sleep(0.3)
    print("thread done")

def main():
    atexit.register(lambda: print("atexit ran"))
    threading.Thread(target=late).start()  # not a daemon: the exit waits for it
    print("main done", end="")  # no newline, stdout a pipe: still in the buffer
    print()
    {end}

run_then_exit(main)
"""


def run(end: str, ending: str = "run_then_exit(main)") -> subprocess.CompletedProcess:
    """COMMAND with main ending in `end`, the script itself in `ending`, run in a fresh process."""
    script = textwrap.dedent(COMMAND).replace("{end}", end).replace("run_then_exit(main)", ending)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=BUFFERED)


@pytest.mark.parametrize(
    ("end", "status", "stderr"),
    [
        ("return 7", 0, ""),  # a return value is not a status (errors.run_command makes main's int one)
        ("raise SystemExit(3)", 3, ""),
        ("raise SystemExit(None)", 0, ""),
        ("raise SystemExit('Error: bad value')", 1, "Error: bad value\n"),
    ],
)
def test_the_exit_joins_threads_runs_atexit_flushes_and_gives_systemexits_status(end, status, stderr):
    ended = run(end)
    assert ended.returncode == status
    assert ended.stderr == stderr
    assert ended.stdout.splitlines() == ["main done", "thread done", "atexit ran"]  # no "torn down"


def test_without_it_the_same_command_tears_its_modules_down():
    """The control: what run_then_exit leaves out, the interpreter's own exit does."""
    ended = run("return", ending="main()")
    assert ended.returncode == 0
    assert ended.stdout.splitlines() == ["main done", "thread done", "atexit ran", "torn down"]


def test_an_exception_that_escapes_takes_the_interpreters_way_out():
    ended = run("raise RuntimeError('a bug')")
    assert ended.returncode == 1
    assert "Traceback" in ended.stderr and "RuntimeError: a bug" in ended.stderr


def test_output_to_a_closed_pipe_is_the_interpreters_status_120_without_a_traceback():
    script = "from grpo_exp.process_exit import run_then_exit\nrun_then_exit(lambda: print('x' * 100))\n"
    process = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; time.sleep(1); exec({script!r})"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=BUFFERED,
    )
    process.stdout.close()  # `grpo-exp compare ... | head` ended before the command wrote
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 120
    assert b"Traceback" not in stderr
