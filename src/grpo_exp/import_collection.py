"""The model libraries imported at a command's start without Python's cyclic garbage collector walking them.

torch, transformers, TRL, datasets and what they import make about a million objects as they load. Meanwhile the
collector runs every few hundred allocations, and each of its full passes walks everything made so far: in a cold
tiny run on 2 cores, about a third of the CPU samples were its (perf: gc_collect_main and its visits). Those
modules live as long as the process, so nothing there is garbage to find. `without_collection` imports with the
collector off, then freezes what exists (gc.freeze: never walked again, as tests/helpers/warm.py does for its
forks), so that the run's own collections walk only what the run makes. Measured: docs/speed.md.

Only the first use freezes: a sweep's jobs run one after another in one process (Hydra's basic launcher), and a
later job's freeze would keep an earlier job's garbage (its trainer, its model, held in reference cycles until the
next collection) for the rest of the process. The frozen objects are handed back to the collector at exit, so that
the interpreter's last collection still finds them (extensions that count their objects at unload would otherwise
report them as leaked). A command's own `__main__` ends without those collections at all (grpo_exp.process_exit).
"""

import atexit
import functools
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_collection() -> Iterator[None]:
    """Within it, no cyclic collection; after its first use in the process, everything that exists then frozen out
    of the collector's sight."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _freeze_once()
        if enabled:
            gc.enable()


@functools.cache
def _freeze_once() -> None:
    gc.freeze()
    atexit.register(gc.unfreeze)
