"""Process-wide allocator tuning for batch-sized buffers (sampler outputs, gathered feature rows)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger(__name__)

_TUNED = False
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> None:
    """Once per process (glibc only): serve large allocations from the heap and keep freed memory.

    Every batch allocates tens to hundreds of MB (sampler outputs; on the products benchmark 250 MB
    of feature rows). glibc maps each block above its mmap threshold (at most 32 MB) fresh and unmaps
    it when freed, so the next batch takes a page fault per 4 KiB it writes: about 15% of sampling
    time, and 242 vs 143 ms per batch for the row gather of a loader whose workers sample (README).
    With a 1 GiB mmap threshold and a 2 GiB trim threshold freed blocks are reused instead; the
    cost is that up to 2 GiB of freed heap stays with the process. Set ``GRAPHSTORE_MALLOC=default``
    to leave the allocator alone.
    """
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    if os.environ.get("GRAPHSTORE_MALLOC", "").lower() == "default" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    except (OSError, AttributeError):  # not glibc
        return
    logger.debug("allocator tuned for batch-sized buffers (mallopt: %s)", "ok" if ok else "refused")
