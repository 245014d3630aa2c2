"""The model libraries imported at a command's start without Python's cyclic garbage collector walking them.

torch, transformers, TRL, datasets and what they import make about a million objects as they load. Meanwhile the
collector runs every few hundred allocations, and each of its full passes walks everything made so far: in a cold
tiny run on 2 cores, about a third of the CPU samples were its (perf: gc_collect_main and its visits). Those
modules live as long as the process, so nothing there is garbage to find. `without_collection` imports with the
collector off, then freezes what exists (gc.freeze: never walked again, as tests/helpers/warm.py does for its
forks), so that the run's own collections walk only what the run makes. Measured: docs/speed.md.

The frozen objects are handed back to the collector at exit, so that the interpreter's last collection still
finds them (extensions that count their objects at unload would otherwise report them as leaked).
"""

import atexit
import functools
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_collection() -> Iterator[None]:
    """Within it, no cyclic collection; after it, everything that exists frozen out of the collector's sight."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        _unfreeze_at_exit()
        if enabled:
            gc.enable()


@functools.cache
def _unfreeze_at_exit() -> None:
    atexit.register(gc.unfreeze)
