"""Resolve several configs in a fresh interpreter started in a user's project directory, as `grpo-exp train` would
from there: the project's modules import by their own paths (the working directory is on sys.path), and grpo_exp's
resolve phase runs every check a run makes. Each case gets what `report(spec)` returns, or the UserError's message."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]  # support.config's compose_config lives at the repository's root

SCRIPT = """
import json, sys
from grpo_exp.errors import UserError
from grpo_exp.run.resolve import resolve
from support.config import compose_config

{report}

cases, base = json.loads(sys.argv[1]), json.loads(sys.argv[2])
messages = {{}}
for name, overrides in cases.items():
    try:
        messages[name] = report(resolve(compose_config([*base, *overrides]), processes=1))
    except UserError as err:
        messages[name] = str(err)
print(json.dumps(messages))
"""


def resolve_cases(cases: dict[str, list[str]], base: list[str], cwd: Path, report: str) -> dict:
    """`report` is the source of a function `report(spec)` returning something JSON can carry; it may import."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(report=report), json.dumps(cases), json.dumps(base)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])
