"""Allocator settings for training on CPU.

Training allocates and frees the same large tensors every step. By default glibc serves each
allocation above a threshold with a fresh ``mmap`` and returns it to the system on ``free``, so
every step page-faults its activations in again: measured here, that costs a third of a bf16
training step. ``keep_freed_memory()`` tells glibc to serve large blocks from its heap and keep
freed memory for reuse (what jemalloc/tcmalloc do by design). The process then keeps its peak
memory instead of shrinking between steps. Set ``GPTKIT_MALLOC_TUNING=0`` to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_applied = False


def keep_freed_memory() -> bool:
    """Apply the settings once per process (glibc on Linux only); returns whether they are in force."""
    global _applied
    if _applied:
        return True
    if os.environ.get("GPTKIT_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(
        mallopt(_M_MMAP_MAX, 0)  # large blocks from the heap, not one mmap each
        and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # keep freed memory for the next step
        and mallopt(_M_TOP_PAD, 256 << 20)  # grow the heap in large steps
    )
    return _applied
