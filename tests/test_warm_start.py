"""The tests' warm start (tests/helpers/warm.py) goes cold only for a variable that a library may read at import: a
variable set at runtime by a library the tests import (deepspeed's) must not send every later command cold."""

from tests.helpers.warm import same_imports

SERVER = {"PATH": "/usr/bin", "HOME": "/root"}


def test_variables_read_at_runtime_keep_a_command_warm():
    set_by_imports = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR", "_MLFLOW_TELEMETRY_SESSION_ID")
    for variable in (*set_by_imports, "FSDP_VERSION", "ACCELERATE_USE_FSDP", "RANK"):
        assert same_imports({**SERVER, variable: "1"}, SERVER), variable


def test_variables_that_change_imports_send_a_command_cold():
    for variable in ("PYTHONPATH", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES"):
        assert not same_imports({**SERVER, variable: "x"}, SERVER), variable
    assert not same_imports({**SERVER, "PATH": "/elsewhere"}, SERVER)
