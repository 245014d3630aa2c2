"""tests/test_vllm.py's two servers (`grpo-exp serve` on the embedded model and on SERVABLE_TINY's), started as the
session's tests begin, not when the module's first test asks for them: their start-up (43 s alone, 64 s inside make
test, much of it one core importing and loading) then overlaps the tests that run before the module, and they wait
idle until it (both together about 1 CPU-second a minute). The module's `servers` fixture waits for them and stops
them when the module ends. Not under pytest-xdist (each worker would start its own) nor when no selected test needs
them: there the fixture starts them itself, as before."""

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support.config import TINY_RUN, compose_config
from support.servers import free_ports, vllm_servers, vllm_servers_starting

MODULE = "test_vllm.py"
FIXTURE = "servers"  # the module's fixture every test on either server depends on
EMBEDDED = "smollm2_135m"
# The tiny model with heads vLLM's CPU attention serves (32 dimensions; the tiny model's own are 16): where what a test
# checks holds for any weights, its runs take a fraction of the embedded model's steps.
SERVABLE_TINY = [*TINY_RUN, "model.architecture.num_attention_heads=2", "model.architecture.num_key_value_heads=1"]


def servable_tiny_model(directory: str) -> str:
    """SERVABLE_TINY's model saved with its tokenizer under `directory`, for `grpo-exp serve --model <dir>`."""
    from grpo_exp.models import load_tokenizer, materialise_tiny

    cfg = compose_config(SERVABLE_TINY)
    return str(materialise_tiny(cfg.model, load_tokenizer(cfg.model, cfg.cache_dir), directory, seed=0))


class _Early:
    def __init__(self) -> None:
        with contextlib.ExitStack() as stack:  # a start that fails midway leaves no directory or server behind
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="servable_tiny_"))
            self.servable_tiny = servable_tiny_model(directory)
            self.ports = free_ports(2)
            self._ready = stack.enter_context(vllm_servers_starting(self.ports, model=[EMBEDDED, self.servable_tiny]))
            self._stack = stack.pop_all()

    def ready(self) -> tuple[int, int]:
        self._ready()
        return tuple(self.ports)

    def stop(self) -> None:
        self._stack.close()


_early: _Early | None = None


def start_early(session) -> None:
    """At the collection's end: the servers start if a selected test needs them (pytest's `session.items`)."""
    global _early
    if hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return
    needed = any(Path(str(item.path)).name == MODULE and FIXTURE in item.fixturenames for item in session.items)
    if needed and importlib.util.find_spec("vllm") is not None:
        _early = _Early()


def stop_early() -> None:
    """At the session's end, should the module's fixture not have stopped them (the session interrupted)."""
    global _early
    if _early is not None:
        _early, early = None, _early
        early.stop()


def servable_tiny(make_directory) -> str:
    """The directory of the model the early tiny server serves, else one made in `make_directory()`."""
    return _early.servable_tiny if _early is not None else servable_tiny_model(str(make_directory()))


@contextlib.contextmanager
def servers(servable_tiny_directory: str) -> Iterator[tuple[int, int]]:
    """The two servers' ports (the embedded model's, the tiny model's) once both answer; stopped at the end."""
    if _early is not None and _early.servable_tiny == servable_tiny_directory:
        try:
            yield _early.ready()
        finally:
            stop_early()
        return
    ports = free_ports(2)
    with vllm_servers(ports, model=[EMBEDDED, servable_tiny_directory]):
        yield tuple(ports)
