"""`pip install` through uv where it can: `python -m support.install [pip install arguments]`.

The Makefile's installs of the requirements go through here. uv resolves and installs the same requirements as pip,
downloading and unpacking side by side where pip does one file after another (make test's three installs: 63 s
against 110 s for pip, uv's cache empty, 2 cores; the same versions; docs/setup.md). uv reads none of pip's
configuration, so the package sources pip is configured with (its config files and PIP_* variables: index-url,
extra-index-url, find-links, constraint, cert) are handed over. Where uv is not installed or fails, for any reason,
pip installs instead, as it did before uv, after a line saying so: an install that pip can do never fails because
of uv.
"""

import ast
import importlib.util
import os
import re
import subprocess
import sys

# pip's configuration keys that uv takes as arguments, each value of each key one argument
SOURCE_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
}
# `section.key=value`, the value as repr() writes it
CONFIG_LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[a-z-]+)=(?P<value>'.*'|\".*\")$")


def pip_settings(config_list: str) -> dict[str, list[str]]:
    """pip's settings from `pip config list`'s lines (`global.find-links='/opt/wheels'`, `:env:.cert='...'`): each key's
    values, split where pip splits a list (spaces, new lines), of the section that wins (the environment over
    `install` over `global`; of two files, the one pip reads later, listed later)."""
    rank = {":env:": 0, "install": 1, "global": 2}
    chosen: dict[str, tuple[int, list[str]]] = {}
    for line in config_list.splitlines():
        match = CONFIG_LINE.match(line.strip())
        if match is None or match["section"] not in rank:
            continue
        key, order = match["key"], rank[match["section"]]
        if key not in chosen or order <= chosen[key][0]:
            chosen[key] = (order, ast.literal_eval(match["value"]).split())
    return {key: values for key, (_, values) in chosen.items()}


def uv_command(python: str, args: list[str], settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """uv's `pip install` of `args` into `python`'s environment with pip's package sources, and the environment
    variables it needs besides (pip's certificate bundle)."""
    sources = [f"{SOURCE_OPTIONS[key]}={value}" for key in SOURCE_OPTIONS for value in settings.get(key, [])]
    environment = {"SSL_CERT_FILE": settings["cert"][0]} if settings.get("cert") else {}
    # pip takes the best version found on any of its indexes; uv by default only those of the first that has the
    # package, so that with pip's extra indexes it refused versions pip installs
    strategy = "--index-strategy=unsafe-best-match"
    return [python, "-m", "uv", "pip", "install", "--quiet", "--python", python, strategy, *sources, *args], environment


def main(args: list[str]) -> int:
    python = sys.executable
    pip = [python, "-m", "pip", "install", "--quiet", "--no-compile", *args]
    if importlib.util.find_spec("uv") is None:
        return subprocess.run(pip, check=False).returncode
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    command, environment = uv_command(python, args, pip_settings(listed.stdout))
    status = subprocess.run(command, env={**os.environ, **environment}, check=False).returncode
    if status == 0:
        return 0
    print(f"support.install: uv failed (status {status}); installing with pip instead", file=sys.stderr, flush=True)
    return subprocess.run(pip, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
