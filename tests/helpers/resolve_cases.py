"""Resolve several configs in a process of their own started in a user's project directory, as `grpo-exp train`
would from there: the project's modules import by their own paths (the working directory is on sys.path), and
grpo_exp's resolve phase runs every check a run makes. Each case gets what `report(spec)` returns, or the
UserError's message. The process is forked from the tests' warm interpreter where it can be (tests/helpers/warm.py:
torch, transformers and TRL imported once, about 14 s a call on 2 busy cores), a new one otherwise.

    python -m tests.helpers.resolve_cases CASES_JSON BASE_JSON REPORT_SOURCE
"""

import json
import os
import sys
from pathlib import Path

from grpo_exp.paths import REPO_ROOT  # support.config's compose_config lives at the repository's root


def resolve_cases(cases: dict[str, list[str]], base: list[str], cwd: Path, report: str) -> dict:
    """`report` is the source of a function `report(spec)` returning something JSON can carry; it may import."""
    from tests.helpers.cli import run_command

    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "tests.helpers.resolve_cases", json.dumps(cases), json.dumps(base), report]
    result = run_command(argv, cwd=cwd, timeout=600, env={"PYTHONPATH": path})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def main(cases: dict[str, list[str]], base: list[str], report_source: str) -> dict:
    from grpo_exp.errors import UserError
    from grpo_exp.run.resolve import resolve
    from support.config import compose_config

    namespace: dict = {}
    exec(report_source, namespace)  # the test's report(spec)
    messages = {}
    for name, overrides in cases.items():
        try:
            messages[name] = namespace["report"](resolve(compose_config([*base, *overrides]), processes=1))
        except UserError as err:
            messages[name] = str(err)
    return messages


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3])))
