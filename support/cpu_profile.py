"""Where the test suite's CPU goes, per test: what to cut when `make test` is slow (docs/setup.md).

    GRPO_EXP_TEST_CPU_LOG=/tmp/cpu.jsonl .venv/bin/python -m support.test_tiers -p support.cpu_profile
    .venv/bin/python -m support.cpu_profile /tmp/cpu.jsonl --top 40

As a pytest plugin (`-p support.cpu_profile`) it appends to the log, for each test, the CPU of the test's process
and of the processes it started and waited for (a cold command, a server stopped at the end of its module: that
one's whole life), setup to teardown. The commands forked by the warm server (tests/helpers/warm.py) are not the
test's children: the server appends their own lines. `--durations` gives wall time; on 2 cores shared by two tiers
wall time says little about what a test costs.
"""

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

LOG_VARIABLE = "GRPO_EXP_TEST_CPU_LOG"  # tests/helpers/warm.py's CPU_LOG_VARIABLE: an absolute path (commands move)


def _usage() -> tuple[float, float, int]:
    """CPU seconds, of them the kernel's (page faults, most of it), and minor page faults: this process's and its
    waited-for children's."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    system = own.ru_stime + children.ru_stime
    return own.ru_utime + children.ru_utime + system, system, own.ru_minflt + children.ru_minflt


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(LOG_VARIABLE)
    (cpu, system, faults), wall = _usage(), time.monotonic()
    yield
    if log:
        (cpu_end, system_end, faults_end) = _usage()
        record = {
            "test": item.nodeid,
            "cpu_s": round(cpu_end - cpu, 2),
            "wall_s": round(time.monotonic() - wall, 2),
            "sys_s": round(system_end - system, 2),
            "minflt": faults_end - faults,
            # when it ended, and in which process: a timeline of the workers, to find where the cores stood idle
            "ended": round(time.time(), 1),
            "pid": os.getpid(),
        }
        with open(log, "a") as file:
            file.write(json.dumps({**record, "command": ""}) + "\n")


def test_of(record: dict) -> str:
    """The test a line is for: a pytest node id, or PYTEST_CURRENT_TEST's (`<node id> (call)`) for a command."""
    test = record["test"]
    return test.rsplit(" (", 1)[0] if test.endswith(")") else test


def per_test(records: list[dict]) -> dict[str, dict]:
    """Each test's CPU seconds (its process and its commands), its wall seconds and its number of commands."""
    totals: dict[str, dict] = defaultdict(lambda: {"cpu_s": 0.0, "wall_s": 0.0, "commands": 0})
    for record in records:
        total = totals[test_of(record) or "(no test: a command run outside pytest's tests)"]
        total["cpu_s"] += record["cpu_s"]
        if record["command"]:
            total["commands"] += 1
        else:
            total["wall_s"] += record["wall_s"]
    return dict(totals)


def per_file(tests: dict[str, dict]) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for test, total in tests.items():
        files[test.split("::")[0]] += total["cpu_s"]
    return dict(files)


def report(records: list[dict], top: int) -> str:
    tests = per_test(records)
    lines = [f"{len(tests)} tests, {sum(t['cpu_s'] for t in tests.values()) / 60:.1f} CPU minutes accounted"]
    if any("sys_s" in record for record in records):  # logs written before these fields have none
        system = sum(record.get("sys_s", 0.0) for record in records) / 60
        faults = sum(record.get("minflt", 0) for record in records) / 1e6
        lines[0] += f", {system:.1f} of them the kernel's ({faults:.1f} million minor page faults)"
    lines.append("\n  CPU s   wall s  commands  test")
    for test, total in sorted(tests.items(), key=lambda item: -item[1]["cpu_s"])[:top]:
        lines.append(f"{total['cpu_s']:7.1f} {total['wall_s']:8.1f} {total['commands']:9d}  {test}")
    lines.append("\n  CPU s  file")
    for file, cpu in sorted(per_file(tests).items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{cpu:7.1f}  {file}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.cpu_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help=f"the file {LOG_VARIABLE} named")
    parser.add_argument("--top", type=int, default=30, help="the tests and files with the most CPU (default 30)")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top={args.top}: how many tests and files to list, 1 or more")
    try:
        records = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        print(f"python -m support.cpu_profile {args.log}: cannot read it as a CPU log: {err}", file=sys.stderr)
        return 2
    print(report(records, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
