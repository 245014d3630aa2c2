"""A command's end: the interpreter's exit without its last collections.

When a command is done, Python's exit joins the non-daemon threads, runs the atexit handlers (W&B's finish, the
process group's teardown, logging's flush, a sweep's report), then tears the modules down, walking the whole heap
with the cyclic collector several times. After torch, transformers, TRL and vLLM, that heap holds about a million
objects, and the walks took 4.6-8 s of every command's end on 2 cores, after its last line was printed (a tiny run
was 18.7 s in all: docs/speed.md). The heap is not kept frozen for those walks instead, because then triton's
extension reports each of its objects still alive at its unload as leaked (grpo_exp.import_collection).

So a command's `__main__` ends here: the same first steps, output flushed, then the process ends (os._exit), as a
forked child does and as the tests' commands have always ended (tests/helpers/warm.py). An exception that escapes
the command takes the interpreter's usual way out (its traceback, its exit), unchanged.
"""

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

# The interpreter's status when flushing stdout fails at exit (a closed pipe: `grpo-exp compare ... | head`).
FLUSH_FAILED = 120


def exit_status(stop: SystemExit) -> int:
    """The status the interpreter gives a SystemExit: None 0, an int itself, anything else printed and 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def run_then_exit(command: Callable[..., object], *args: object) -> NoReturn:
    """Runs a command's `__main__`, `command(*args)`, then ends the process as the interpreter would (threads joined,
    atexit handlers run, output flushed) but without tearing the modules down."""
    try:
        command(*args)
        status = 0
    except SystemExit as stop:
        status = exit_status(stop)
    leave(status)


def leave(status: int) -> NoReturn:
    threading._shutdown()  # what the interpreter's exit does first: wait for the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a stream a handler closed
            status = status or FLUSH_FAILED
    os._exit(status)
