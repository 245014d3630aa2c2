"""The bytecode of what is used, written once after an install: `python -m support.compile_imports [GROUP ...]`.

The Makefile installs with pip's --no-compile. pip compiles every file it installs, 34,000 of them with the tests'
tools and vLLM, about 60 of the 100 seconds of make test's install, on one core; a run imports about 8,000 of them.
Importing what is used writes the bytecode of those alone, once, before several processes would each compile them at
the same time (docs/setup.md). A module not listed is compiled when first imported, and its bytecode written then:
the Makefile's commands write it even where PYTHONDONTWRITEBYTECODE is set, and so does this step.

Groups: `run` (the default), what a training run imports (support/run_imports.py); `vllm`, vLLM's server and engine;
`tests`, the tests' own tools. Several groups are imported side by side, each in a process of its own. A module that
is not installed is passed over; one that fails to import is named, and the install goes on: the command that needs
it says what is wrong.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

from support.run_imports import IMPORTS, OPTIONAL_IMPORTS, RUN_IMPORTS

GROUPS = {
    "run": (*IMPORTS, *RUN_IMPORTS, *OPTIONAL_IMPORTS),
    # what `grpo-exp serve` and an engine in the trainer's process import (their engine core and CPU worker too)
    "vllm": (
        "vllm.entrypoints.openai.api_server",
        "vllm.v1.engine.core",
        "vllm.v1.worker.cpu_worker",
        "vllm.model_executor.models.llama",
    ),
    "tests": ("pytest", "xdist", "hypothesis", "mlflow"),
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package missing
        return False


def compile_imports(modules: list[str]) -> list[str]:
    """Import each of `modules` that is installed, writing bytecode; returns a line for each that failed."""
    sys.dont_write_bytecode = False
    failed = []
    with warnings.catch_warnings():  # what the compiler says of a library's source (SyntaxWarning) is not ours
        warnings.simplefilter("ignore")
        for module in modules:
            try:  # finding a submodule imports its parents, which may fail too
                if installed(module):
                    importlib.import_module(module)
            except Exception as err:  # a library's own import error: named and passed over
                failed.append(f"{module}: {type(err).__name__}: {err}")
    return failed


def main(groups: list[str]) -> int:
    unknown = [group for group in groups if group not in GROUPS]
    if unknown:
        print(f"support.compile_imports: no group {', '.join(unknown)}; the groups: {', '.join(GROUPS)}")
        return 2
    if len(groups) > 1:
        return side_by_side(groups)
    started = time.monotonic()
    modules = [module for group in groups or ["run"] for module in GROUPS[group]]
    for line in compile_imports(modules):
        print(f"support.compile_imports: not compiled, it failed to import: {line}", file=sys.stderr)
    elapsed = time.monotonic() - started
    print(f"support.compile_imports: {len(sys.modules)} modules imported, their bytecode written, in {elapsed:.0f} s")
    return 0


def group_command(group: str) -> list[str]:
    return [sys.executable, "-m", "support.compile_imports", group]


def side_by_side(groups: list[str], command_of: Callable[[str], list[str]] = group_command) -> int:
    """Each group in a process of its own, all at once: pip installs on one core and leaves the others idle, and the
    groups' imports are mostly a process's own work (make test's install: 53 s against 82 s one after the other, for
    24 more CPU-s where two groups compile a module they share, AVX2-only EPYC, 2 cores)."""
    processes = [subprocess.Popen(command_of(group)) for group in groups]
    statuses = [process.wait() for process in processes]
    return next((status for status in statuses if status != 0), 0)  # a group killed (a negative status) fails too


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # without the interpreter's teardown of 9,000 modules (~3 s): there is nothing to save
