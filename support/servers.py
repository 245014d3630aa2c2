"""Start real servers on 127.0.0.1 for the duration of a test or a benchmark."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STUB = Path(__file__).with_name("openai_stub_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no server on port {port} after {timeout} s")


@contextlib.contextmanager
def serving(args: list[str], port: int, env: dict | None = None, timeout: float = 180):
    """Run a server process until the block ends; yields the process (a test may kill it early). The server and
    whatever it started (vLLM's engine core and its worker) go together: asked to stop (SIGTERM, vLLM shuts its
    engine down), then killed as a process group. Killing the server alone left vLLM's engine running, orphaned,
    2.6 GB and a few % of a core each, one per test session."""
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        _wait_for_port(port, process, timeout)
        yield process
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM to the process's group, then SIGKILL to what is left of it after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stub_server(mode: str, port: int, env: dict | None = None):
    return serving([sys.executable, str(STUB), mode, str(port)], port, env=env)


SERVED_EMBEDDED = "smollm2_135m"  # the name `grpo-exp serve` serves the embedded model under


def served_judge_overrides(base_url: str) -> list[str]:
    """The judge in scores mode at vllm_server's `base_url` (http://host:port), the embedded tokenizer rendering its
    chat template."""
    return [
        "reward=judge",
        "judge=openai",
        f"judge.model={SERVED_EMBEDDED}",
        "judge.timeout=120",
        f"judge.tokenizer={SERVED_EMBEDDED}",
        f"judge.base_url={base_url}/v1",
    ]


def stub_judge_overrides(port: int) -> list[str]:
    """judge=openai pointed at stub_server(mode, port), the tiny model's tokenizer rendering its chat template."""
    return ["judge=openai", "judge.model=stub", "judge.tokenizer=tiny", f"judge.base_url=http://127.0.0.1:{port}/v1"]


@contextlib.contextmanager
def vllm_server(port: int, timeout: float = 420, prefix: tuple[str, ...] = (), env: dict | None = None):
    """`grpo-exp serve` (vLLM's OpenAI-compatible server, the embedded model as `smollm2_135m`), until it answers;
    `prefix`: a command it runs under (taskset -c 1), `env`: its environment."""
    import requests

    command = [*prefix, sys.executable, "-m", "grpo_exp.serve", "--port", str(port)]
    with serving(command, port, env=env, timeout=timeout) as process:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"grpo-exp serve exited with {process.returncode}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM's server on port {port} did not answer in {timeout} s")
            time.sleep(1)
        yield process
