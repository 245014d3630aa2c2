"""Memory the process freed, handed back to the operating system.

On Linux with glibc, tensors below malloc's mmap threshold (which rises to 32 MB as large blocks are freed) come from
the heap, and freeing them leaves the pages resident for reuse. A freed copy of the weights (the sampling copy between
generations) would then stay in the process's resident set and add to the next phase's peak (docs/scale.md).
`malloc_trim` returns every whole free page of the heap.
"""

import ctypes
import ctypes.util
import functools


def c_function(name: str):
    """The C library's function `name`, or None where it has none (glibc's malloc_trim and mallinfo2 are not on
    macOS or musl)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None


@functools.cache
def _malloc_trim():
    return c_function("malloc_trim")


def return_freed_memory() -> None:
    """Hands the heap's free pages back to the operating system, where the C library can (a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
