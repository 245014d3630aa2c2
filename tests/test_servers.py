"""support.servers: a server started for a test or a benchmark stops with everything it started."""

import sys
import time
from pathlib import Path

from support.servers import free_port, serving


def running(pid: int) -> bool:
    """Alive, not a zombie (a dead child that nobody reaped yet counts as gone)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


def test_a_server_stops_with_the_processes_it_started(tmp_path):
    """vLLM's server starts its engine core as a child process: stopping the server alone left it running."""
    port, child_file = free_port(), tmp_path / "child"
    script = f"sleep 600 & echo $! > {child_file}; exec {sys.executable} -m http.server {port} --bind 127.0.0.1"
    with serving(["bash", "-c", script], port):
        child = int(child_file.read_text())
        assert running(child)
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(child)
