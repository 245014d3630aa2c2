"""support/cpu_profile.py: each test's CPU, its own process's and its commands' (the warm server's accounts)."""

import json
import os
import subprocess
import sys

import pytest

from grpo_exp.paths import REPO_ROOT
from support import cpu_profile
from tests.helpers import warm

BURNS = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n"


def test_a_tests_cpu_is_its_process_and_its_commands():
    records = [
        {"test": "tests/test_a.py::test_one", "cpu_s": 2.0, "wall_s": 30.0, "command": ""},
        {"test": "tests/test_a.py::test_one (call)", "cpu_s": 10.0, "wall_s": 9.0, "command": "grpo_exp.train x"},
        {"test": "tests/test_a.py::test_one (setup)", "cpu_s": 5.0, "wall_s": 4.0, "command": "grpo_exp.train y"},
        {"test": "tests/test_b.py::test_two[1]", "cpu_s": 1.5, "wall_s": 2.0, "command": ""},
        {"test": "", "cpu_s": 7.0, "wall_s": 60.0, "command": "vllm serve"},
    ]
    tests = cpu_profile.per_test(records)
    assert tests["tests/test_a.py::test_one"] == {"cpu_s": 17.0, "wall_s": 30.0, "commands": 2}
    assert tests["tests/test_b.py::test_two[1]"] == {"cpu_s": 1.5, "wall_s": 2.0, "commands": 0}
    assert cpu_profile.per_file(tests)["tests/test_a.py"] == 17.0
    lines = cpu_profile.report(records, top=1).splitlines()
    assert lines[0] == "3 tests, 0.4 CPU minutes accounted"
    assert lines[2:4] == ["  CPU s   wall s  commands  test", "   17.0     30.0         2  tests/test_a.py::test_one"]
    assert "test_two" not in "\n".join(lines)


def test_the_summary_says_the_kernels_share_where_the_log_has_it():
    records = [
        {"test": "tests/test_a.py::test_one", "cpu_s": 60.0, "wall_s": 60.0, "sys_s": 6.0, "minflt": 1_500_000},
        {"test": "tests/test_a.py::test_one (call)", "cpu_s": 60.0, "wall_s": 1.0, "command": "grpo_exp.train"},
    ]
    records[0]["command"] = ""
    records[1] |= {"sys_s": 12.0, "minflt": 2_500_000}
    first = cpu_profile.report(records, top=1).splitlines()[0]
    assert first == "1 tests, 2.0 CPU minutes accounted, 0.3 of them the kernel's (4.0 million minor page faults)"


@pytest.mark.skipif(os.environ.get("GRPO_EXP_TEST_COLD") == "1", reason="GRPO_EXP_TEST_COLD=1: every command cold")
def test_the_warm_server_accounts_a_commands_cpu_under_the_test_that_ran_it(tmp_path):
    (tmp_path / "burns.py").write_text(BURNS)
    log = tmp_path / "cpu.jsonl"
    env = {**os.environ, cpu_profile.LOG_VARIABLE: str(log)}
    assert warm.CPU_LOG_VARIABLE == cpu_profile.LOG_VARIABLE
    result = warm.run([sys.executable, "-m", "burns", "--flag"], tmp_path, env, timeout=60)
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert cpu_profile.test_of(record) == os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
    assert record["command"] == "burns --flag" and 0.3 <= record["cpu_s"] < 5 and record["wall_s"] >= 0.3
    assert 0 <= record["sys_s"] <= record["cpu_s"] and record["minflt"] > 0


def test_the_plugin_writes_each_tests_cpu_and_the_summary_reads_it(tmp_path):
    (tmp_path / "test_burns.py").write_text(f"def test_burns():\n    exec({BURNS!r})\n\n\ndef test_idle():\n    pass\n")
    log = tmp_path / "cpu.jsonl"
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "support.cpu_profile", "-p", "no:cacheprovider"]
    env = {**os.environ, cpu_profile.LOG_VARIABLE: str(log), "PYTHONPATH": str(REPO_ROOT)}  # support.cpu_profile
    ran = subprocess.run([*pytest_run, "test_burns.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    records = {r["test"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert records["test_burns.py::test_burns"]["cpu_s"] >= 0.3 and records["test_burns.py::test_idle"]["cpu_s"] < 0.3
    assert all(0 <= r["sys_s"] <= r["cpu_s"] and r["minflt"] >= 0 for r in records.values())
    summary = subprocess.run(
        [sys.executable, "-m", "support.cpu_profile", str(log), "--top", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert summary.returncode == 0 and "test_burns.py::test_burns" in summary.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "support.cpu_profile", str(tmp_path / "none.jsonl")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "none.jsonl: cannot read it as a CPU log" in refused.stderr
    assert "Traceback" not in refused.stderr
