"""Argument types for the benchmarks' commands: a path is checked as argparse parses it, so that a missing or wrong
one ends in a usage message naming it, before any work, never in a traceback."""

import argparse
from collections.abc import Callable
from pathlib import Path


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'not a file' if path.exists() else 'no such file'}")
    return path


def existing_directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'not a directory' if path.exists() else 'no such directory'}")
    return path


def run_directory_with(*files: str) -> Callable[[str], Path]:
    """A run directory holding `files` (a run's eval_before.jsonl, ...): which of them it lacks, named."""

    def run_directory(text: str) -> Path:
        path = existing_directory(text)
        missing = [name for name in files if not (path / name).is_file()]
        if missing:
            raise argparse.ArgumentTypeError(f"{text}: a run directory without {', '.join(missing)}")
        return path

    return run_directory
