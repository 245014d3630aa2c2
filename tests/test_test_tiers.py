"""make test's runner (support/test_tiers.py): the two pytest tiers side by side, its status failing when either
tier fails, and each tier's report printed."""

import os
import subprocess
import sys

import pytest

from grpo_exp.paths import REPO_ROOT
from support.test_tiers import E2E_ENVIRONMENT, IN_PROCESS_ENVIRONMENT

PASSES = "def test_passes():\n    pass\n"
FAILS = "def test_fails():\n    assert False\n"
E2E_PASSES = "import pytest\n\n\n@pytest.mark.e2e\ndef test_e2e_passes():\n    pass\n"
E2E_FAILS = "import pytest\n\n\n@pytest.mark.e2e\ndef test_e2e_fails():\n    assert False\n"
TIERS_VARIABLES = {*IN_PROCESS_ENVIRONMENT, *E2E_ENVIRONMENT}  # what support/test_tiers.py sets


def run_tiers(directory, *args: str, workers: str = "0", **variables: str) -> subprocess.CompletedProcess:
    """The runner on the tests in `directory`, run from there (its report goes to the directory's outputs/, never
    the repository's, where a running make test writes its own), with no configuration file but its own, and
    OpenMP's wait policy and thread count and glibc's tunables only where `variables` set them (the tiers' own:
    support/test_tiers.py).
    Of the installed pytest plug-ins only xdist (the tiers' -n) is loaded: the others' imports took ~1.1 of each
    pytest's ~1.3 s."""
    environment = {key: value for key, value in os.environ.items() if key not in TIERS_VARIABLES}
    environment.update(PYTHONPATH=str(REPO_ROOT), TEST_WORKERS=workers, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **variables)
    isolated = ["-c", os.devnull, "--rootdir", ".", "-p", "no:cacheprovider", "-p", "xdist", "-W", "ignore"]
    return subprocess.run(
        [sys.executable, "-m", "support.test_tiers", *isolated, *args],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("files", "failed"),
    [
        ({"test_a.py": PASSES, "test_b.py": E2E_PASSES}, []),
        ({"test_a.py": FAILS, "test_b.py": E2E_PASSES}, ["the in-process tier"]),
        ({"test_a.py": PASSES, "test_b.py": E2E_FAILS}, ["the e2e and slow tier"]),
        ({"test_a.py": FAILS, "test_b.py": E2E_FAILS}, ["the e2e and slow tier", "the in-process tier"]),
        ({"test_a.py": PASSES}, []),  # no e2e test selected (pytest's 5) is not a failure
    ],
)
def test_the_status_fails_when_either_tier_fails_and_both_reports_are_printed(tmp_path, files, failed):
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    completed = run_tiers(tmp_path)
    assert completed.returncode == (1 if failed else 0), completed.stdout + completed.stderr
    if failed:
        assert completed.stderr.strip().endswith(f"make test: failed in {' and in '.join(failed)}")
    # the in-process tier's report, from its log, after the e2e tier's own
    report = (tmp_path / "outputs" / "test-in-process.log").read_text()
    assert report and report in completed.stdout
    assert completed.stdout.index("---- the in-process tier") < completed.stdout.index(report)
    assert ("test_a.py::test_fails" in report) == ("test_a.py" in files and files["test_a.py"] == FAILS)


def test_a_worker_count_that_is_not_a_number_is_refused_naming_it(tmp_path):
    completed = run_tiers(tmp_path, workers="two")
    assert completed.returncode == 2
    assert completed.stderr.strip() == "TEST_WORKERS=two: each tier's number of worker processes, 0 or more"


def test_a_disk_with_less_free_than_the_suite_writes_is_named_once():
    from support.test_tiers import disk_warnings

    here = REPO_ROOT
    assert disk_warnings([here, here / "src"], needed_gb=0) == []
    [line] = disk_warnings([here, here / "src"], needed_gb=1e9)  # one file system, named once
    assert line.startswith("make test: ") and f"the disk of {here};" in line and "No space left on device" in line


def sees(expected: dict[str, str | None], e2e: bool = False) -> str:
    """A test file whose one test passes where each variable of `expected` is in the environment as given there
    (None: not set)."""
    mark = "@pytest.mark.e2e\n" if e2e else ""
    return (
        f"import os\n\nimport pytest\n\n\n{mark}def test_variables():\n"
        f"    assert {{name: os.environ.get(name) for name in {list(expected)!r}}} == {expected!r}\n"
    )


USERS_OWN = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "2", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize(
    ("given", "in_process", "e2e"),
    [
        (
            {},
            {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", **HUGE_PAGES},
            {"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": "1", **HUGE_PAGES},
        ),
        (USERS_OWN, USERS_OWN, USERS_OWN),
    ],
)
def test_each_tier_computes_on_one_thread_and_huge_pages_the_in_process_ones_asleep_unless_the_user_says_otherwise(
    tmp_path, given, in_process, e2e
):
    (tmp_path / "test_a.py").write_text(sees(in_process))
    (tmp_path / "test_b.py").write_text(sees(e2e, e2e=True))
    completed = run_tiers(tmp_path, **given)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "2 passed" not in completed.stdout and completed.stdout.count("1 passed") == 2, completed.stdout


def test_each_file_is_a_group_and_files_reading_one_shared_run_are_one():
    from support.test_tiers import xdist_groups

    tests = [
        ("test_a.py", {"tmp_path"}),
        ("test_b.py", {"tiny_run"}),
        ("test_c.py", {"project"}),
        ("test_d.py", {"tiny_run", "sweep"}),
        ("test_e.py", {"sweep"}),
        ("test_a.py", {"other_run"}),  # its file joined another group through a test of its own
        ("test_f.py", {"other_run"}),
    ]
    groups = xdist_groups(tests, shared_runs={"tiny_run", "sweep", "other_run"})
    assert groups == ["test_a.py", "test_b.py", "test_c.py", "test_b.py", "test_b.py", "test_a.py", "test_a.py"]


def test_the_e2e_tier_runs_a_group_in_one_worker(tmp_path):
    """Each e2e test writes which worker ran it: two files in one xdist group (as tests/conftest.py groups them) run
    in one of the tier's two workers, a third file beside them in any."""
    ran = tmp_path / "ran"
    body = (
        "import os\n\nimport pytest\n\n{mark}\n\n@pytest.mark.e2e\n@pytest.mark.parametrize('i', range(3))\n"
        "def test_records_its_worker(i):\n"
        f"    with open({str(ran)!r}, 'a') as f:\n"
        "        f.write(f\"{{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n\")\n"
    )
    (tmp_path / "test_a.py").write_text(body.format(mark="pytestmark = pytest.mark.xdist_group('shared')"))
    (tmp_path / "test_b.py").write_text(body.format(mark="pytestmark = pytest.mark.xdist_group('shared')"))
    (tmp_path / "test_c.py").write_text(body.format(mark=""))
    completed = run_tiers(tmp_path, workers="2")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    workers = {}
    for line in ran.read_text().splitlines():
        module, worker = line.split()
        workers.setdefault(module, set()).add(worker)
    assert len(workers["test_a"] | workers["test_b"]) == 1, workers  # pytest 9.2 sent them anywhere (pyproject.toml)


def test_the_in_process_tier_runs_at_a_lower_priority_than_the_e2e_tier(tmp_path):
    from support.test_tiers import IN_PROCESS_NICENESS

    here = os.getpriority(os.PRIO_PROCESS, 0)  # this test's own (make test's in-process tier runs it niced already)
    for name, niceness, mark in (("test_a.py", min(here + IN_PROCESS_NICENESS, 19), ""), ("test_b.py", here, "e2e")):
        decorator = f"@pytest.mark.{mark}\n" if mark else ""
        (tmp_path / name).write_text(
            f"import os\n\nimport pytest\n\n\n{decorator}def test_niceness():\n"
            f"    assert os.getpriority(os.PRIO_PROCESS, 0) == {niceness}\n"
        )
    completed = run_tiers(tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.count("1 passed") == 2, completed.stdout
