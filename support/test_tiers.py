"""`make test`'s two pytest tiers, side by side: `python -m support.test_tiers [pytest arguments]`.

In front, the e2e and slow tests in TEST_WORKERS processes, a file (or the files that read one shared run) to each
(tests/conftest.py's xdist groups), every command on one thread (E2E_ENVIRONMENT); behind them, at a lower CPU
priority (IN_PROCESS_NICENESS), the in-process tests in TEST_WORKERS processes, one thread each, waiting asleep
(IN_PROCESS_ENVIRONMENT); both tiers' malloc on transparent huge pages (ALLOCATOR_ENVIRONMENT). A user's own
OMP_NUM_THREADS, OMP_WAIT_POLICY or GLIBC_TUNABLES is kept.
On 2 cores: 14 min 6 s, against 17 min 50 s for the two one after the other (docs/setup.md); the e2e tier alone in
two single-threaded workers 20 min 6 s and 34.4 core-minutes, against 26 min 45 s and 38.2 in one process of two
threads (AVX2-only EPYC).

The in-process tier's report goes to outputs/test-in-process.log: printed from where it stands when the e2e tier
ends, then followed until it ends too. The status is 0 only when neither tier failed (pytest's 5, no test selected,
is what a tier gives when the arguments pick tests of the other tier only).

Where the disk holding the tests' temporary files or the repository has less free than the suite writes at its peak,
that is said before the tests start and again after a failure: a full disk fails tests far from the cause.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOG = Path("outputs") / "test-in-process.log"
NO_TESTS_COLLECTED = 5
# Both tiers' processes compute on one thread each (a user's own OMP_NUM_THREADS is kept): two workers per tier keep
# both cores busy, and a second thread per process cut its time by a fifth while raising its CPU by a third (the
# embedded model's self-verification run: 57 s and 80 CPU-s on two threads, 71 s and 51 CPU-s on one). The
# in-process tier's threads, where a library starts more, wait asleep at a barrier instead of spinning (a user's own
# OMP_WAIT_POLICY is kept): a thread spinning at a low priority burns what the tier could compute (docs/setup.md).
# Both tiers' malloc asks the kernel for transparent huge pages (a user's own GLIBC_TUNABLES is kept): the tests'
# trainings map and unmap tensors of 1-100 MB every step, each 4 KiB page of them faulted in and zeroed anew. With it
# a subset's minor page faults fell 13-fold and its kernel time by 40-60%, its CPU by 3-7% (alternated, AVX2-only
# EPYC; docs/setup.md). The whole suite's kernel time did not fall (it zeroes 2 MiB pages instead), so its gain there
# is those few percent of user time at most. Where the kernel's huge pages are off, or the C library is not glibc, it
# changes nothing.
ALLOCATOR_ENVIRONMENT = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
IN_PROCESS_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", **ALLOCATOR_ENVIRONMENT}
E2E_ENVIRONMENT = {"OMP_NUM_THREADS": "1", **ALLOCATOR_ENVIRONMENT}
# Behind the e2e tier, but not starved: at nice 19 its processes got 1.5% of a core while the e2e tier's two workers
# kept both cores busy, and a test that waits for a command of its own (a fresh interpreter's 27 CPU-s) ran out of
# its 300 s. At 5 they get about a quarter of the cores while the e2e tier runs, and every cycle it leaves.
IN_PROCESS_NICENESS = 5
# The most the suite holds on disk at once, with room: 1.8 GB of temporary files at its peak and the embedded model's
# cache (0.6 GB) on a first run (sampled every 10 s through a make test; docs/setup.md).
DISK_NEEDED_GB = 3.0


def pytest(marks: str, args: list[str], workers: str | None = None) -> list[str]:
    # loadgroup: xdist's `load`, but the tests of one xdist_group go to one worker, so that a module's fixture that
    # starts a process for several tests starts it once (test_adding_a_builtin.py)
    parallel = [] if workers is None else ["-n", workers, "--dist", "loadgroup"]
    # support.pytest_then_exit: pytest, without the interpreter's teardown of what the tests imported at the end
    return [sys.executable, "-m", "support.pytest_then_exit", "-m", marks, *parallel, *args]


def xdist_groups(tests: list[tuple[str, set[str]]], shared_runs: set[str]) -> list[str]:
    """The xdist group of each test, given as (its file, the fixtures it uses): its file's, where files that use one of
    `shared_runs` (session fixtures that train a run) join one group, named after the first of its files. Under
    --dist loadgroup a group runs in one worker: a module's fixture is made once, and a shared run trained once."""
    joined: dict[str, str] = {}  # a file or a shared run -> what it joined (union-find)

    def group_of(name: str) -> str:
        while joined.setdefault(name, name) != name:
            name = joined[name]
        return name

    files = {file for file, _ in tests}
    for file, fixtures in tests:
        for run in fixtures & shared_runs:
            ours, theirs = group_of(file), group_of(run)
            if theirs in files:  # two groups of files: the first file names them
                ours, theirs = sorted((ours, theirs))
            joined[theirs] = ours
    return [group_of(file) for file, _ in tests]


def follow(log: Path, process: subprocess.Popen) -> None:
    """Print `log` from its start, then what it gains, until `process` ends."""
    with log.open(errors="replace") as report:
        while True:
            ended = process.poll() is not None
            sys.stdout.write(report.read())
            sys.stdout.flush()
            if ended:
                return
            time.sleep(1)


def disk_warnings(places: list[Path], needed_gb: float = DISK_NEEDED_GB) -> list[str]:
    """A line for each file system among `places` with less than `needed_gb` free (each named once)."""
    lines, seen = [], set()
    for place in places:
        device = place.stat().st_dev
        free_gb = shutil.disk_usage(place).free / 1e9
        if device not in seen and free_gb < needed_gb:
            lines.append(
                f"make test: {free_gb:.1f} GB free on the disk of {place}; the tests write up to about {needed_gb:.0f} "
                "GB there at a time, and with less they fail with 'No space left on device'"
            )
        seen.add(device)
    return lines


def warn_of_disk() -> None:
    for line in disk_warnings([Path(tempfile.gettempdir()), Path.cwd()]):
        print(line, file=sys.stderr, flush=True)


def passed(status: int) -> bool:
    return status in (0, NO_TESTS_COLLECTED)


def main(args: list[str]) -> int:
    workers = os.environ.get("TEST_WORKERS", "2")
    if not workers.isdigit():
        print(f"TEST_WORKERS={workers}: each tier's number of worker processes, 0 or more", file=sys.stderr)
        return 2
    # Stopped (a CI job cancelled, `kill`): as on Ctrl-C, both tiers go with it, none is left running behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    LOG.parent.mkdir(exist_ok=True)
    warn_of_disk()
    print(f"e2e tier: {workers} workers; in-process tier beside it at low priority: {workers}, {LOG}", flush=True)
    with LOG.open("w") as log:
        in_process = subprocess.Popen(
            pytest("not slow and not e2e", args, workers),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**IN_PROCESS_ENVIRONMENT, **os.environ},
            preexec_fn=lambda: os.nice(IN_PROCESS_NICENESS),
        )
    try:
        e2e_tier = pytest("slow or e2e", args, workers)
        e2e = subprocess.run(e2e_tier, env={**E2E_ENVIRONMENT, **os.environ}, check=False).returncode
        print(f"\n---- the in-process tier ({LOG}) ----", flush=True)
        follow(LOG, in_process)
    finally:
        if in_process.poll() is None:  # interrupted or stopped: the tier behind goes too
            in_process.terminate()
            in_process.wait()
    tiers = {"the e2e and slow tier": e2e, "the in-process tier": in_process.returncode}
    failed = [name for name, status in tiers.items() if not passed(status)]
    if failed:
        warn_of_disk()
        print(f"make test: failed in {' and in '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C: pytest has said where it stopped; both tiers are gone (main's finally)
        sys.exit(130)
