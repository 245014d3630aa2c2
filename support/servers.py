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
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket held until all are bound, so the system cannot give one twice."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


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
    with started(args, env) as process:
        _wait_for_port(port, process, timeout)
        yield process


@contextlib.contextmanager
def started(args: list[str], env: dict | None = None):
    """The server process, not waited for, until the block ends; then stopped with whatever it started."""
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
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
def vllm_server(
    port: int,
    timeout: float = 420,
    prefix: tuple[str, ...] = (),
    env: dict | None = None,
    model: str = "smollm2_135m",
    vllm_args: tuple[str, ...] = (),
):
    """`grpo-exp serve` (vLLM's OpenAI-compatible server, the embedded model as `smollm2_135m`), until it answers;
    `prefix`: a command it runs under (taskset -c 1), `env`: its environment, `model`: what `grpo-exp serve --model`
    takes (a model option, a directory), `vllm_args`: vLLM's own options (after serve's `--`)."""
    with vllm_servers([port], timeout, prefix, env, model, vllm_args) as (process,):
        yield process


@contextlib.contextmanager
def vllm_servers(
    ports: list[int],
    timeout: float = 420,
    prefix: tuple[str, ...] = (),
    env: dict | None = None,
    model: str | list[str] = "smollm2_135m",
    vllm_args: tuple[str, ...] = (),
):
    """vllm_server on each of `ports`, started together: their start-ups (about 45 s each on 2 cores, much of it
    one core importing and loading) overlap. Yields their processes once every one answers. `model`: what
    `grpo-exp serve --model` takes (a model option, a directory), for every server or one per port; `vllm_args`:
    vLLM's own options."""
    with vllm_servers_starting(ports, timeout, prefix, env, model, vllm_args) as ready:
        yield ready()


@contextlib.contextmanager
def vllm_servers_starting(
    ports: list[int],
    timeout: float = 420,
    prefix: tuple[str, ...] = (),
    env: dict | None = None,
    model: str | list[str] = "smollm2_135m",
    vllm_args: tuple[str, ...] = (),
):
    """vllm_servers' processes, started and not waited for: yields `ready()`, which waits until every one answers
    (within `timeout` of their start) and returns them, so that their start-ups overlap what the caller does
    meanwhile. Stopped, with whatever they started, when the block ends."""
    models = [model] * len(ports) if isinstance(model, str) else model
    with contextlib.ExitStack() as stack:
        serve = [sys.executable, "-m", "grpo_exp.serve"]
        after = ["--", *vllm_args] if vllm_args else []
        commands = [
            [*prefix, *serve, "--model", name, "--port", str(port), *after]
            for port, name in zip(ports, models, strict=True)
        ]
        processes = [stack.enter_context(started(command, env)) for command in commands]
        deadline = time.monotonic() + timeout

        def ready() -> list[subprocess.Popen]:
            for port, process in zip(ports, processes, strict=True):
                _wait_until_served(port, process, deadline, timeout)
            return processes

        yield ready


def _wait_until_served(port: int, process: subprocess.Popen, deadline: float, timeout: float) -> None:
    """Until vLLM's server on `port` lists its model (its port opens before its engine is ready)."""
    import requests

    while True:
        if process.poll() is not None:
            raise RuntimeError(f"grpo-exp serve exited with {process.returncode}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM's server on port {port} did not answer in {timeout} s")
        time.sleep(1)
