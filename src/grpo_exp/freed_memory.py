"""Memory the process freed, handed back to the operating system.

On Linux with glibc, tensors below malloc's mmap threshold come from the heap, and freeing them leaves the pages
resident for reuse. The threshold starts at 128 KB and rises to the size of each mapped block freed, up to 32 MB, so
in a training run most tensors soon come from the heap. The resident set then holds, besides the live tensors, what
earlier phases freed: 5.7 GiB beside 7.15 GiB live at the backward of Qwen2.5-0.5B's shape at 512 tokens, and a
different amount each run (docs/scale.md).
- `return_large_blocks_when_freed` fixes the threshold at 1 MiB: every tensor of that size or more is mapped on its
  own and unmapped when freed, so that the resident set follows the live tensors (that run's peak: 9.6 GiB, from
  13.5-14.3).
- `return_freed_memory` (`malloc_trim`) returns every whole free page of the heap, where the smaller blocks live: after
  a copy of the weights is freed (the sampling copy between generations), and once before training.
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


# glibc's mallopt parameter: allocations of at least this many bytes are mapped on their own (and the threshold stays)
M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 1 << 20


def return_large_blocks_when_freed(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """From now on, each allocation of at least `threshold` bytes is given back to the operating system when freed
    (glibc's mmap threshold, fixed). False where the C library has no such setting (not glibc)."""
    mallopt = c_function("mallopt")
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, threshold))


@functools.cache
def _malloc_trim():
    return c_function("malloc_trim")


def return_freed_memory() -> None:
    """Hands the heap's free pages back to the operating system, where the C library can (a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
