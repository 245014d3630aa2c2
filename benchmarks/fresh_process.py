"""A benchmark's run in a fresh process of its own, its output captured. A benchmark imports `run_command` by name,
so that its test can put one that starts the run warm (tests/helpers/warm.py) in the benchmark's module."""

import subprocess


def run_command(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)
