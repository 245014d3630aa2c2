"""What tests and benchmarks share (support/) changes nothing by being imported."""

import os
import subprocess
import sys

from grpo_exp.paths import REPO_ROOT

IMPORT_ALL = (
    "import sys, os, tests.conftest; "
    "print(sorted(m for m in ('huggingface_hub', 'datasets', 'transformers') if m in sys.modules)); "
    "import support.models, support.servers, support.reward_cases; "
    "import benchmarks.rewards, benchmarks.judge, benchmarks.time_to_accuracy, benchmarks.overhead_worker; "
    "print('tests.test_rewards' in sys.modules, os.environ.get('HF_HUB_OFFLINE'), os.environ.get('WANDB_API_KEY'))"
)


def test_importing_support_conftest_and_benchmarks_sets_nothing_and_loads_no_hub_client():
    """The hub clients read HF_HUB_OFFLINE when imported: conftest (with what it imports of support/) must not
    import them before pytest_configure sets it; and no import may change the environment (benchmarks used to lose
    WANDB_API_KEY that way, by importing tests.conftest)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["WANDB_API_KEY"] = "kept"
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    hub_clients, after_benchmarks = result.stdout.splitlines()[-2:]
    assert hub_clients == "[]"
    assert after_benchmarks == "False None kept"
