"""`python -m support.pytest_then_exit [pytest arguments]`: pytest, then its process ends as a command does
(grpo_exp.process_exit), without the interpreter's teardown of the model libraries the tests imported: up to 8 s
after a single test file's summary, on 2 cores (docs/setup.md)."""

import sys

import pytest

from grpo_exp.process_exit import leave

if __name__ == "__main__":
    leave(int(pytest.main(sys.argv[1:])))
