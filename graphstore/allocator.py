"""Process-wide allocator tuning for batch-sized buffers (sampler outputs, gathered feature rows), and its stats."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import NamedTuple

logger = logging.getLogger(__name__)

_TUNED = False
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 1 << 30  # blocks below this come from the heap and are reused when freed
TRIM_THRESHOLD = (1 << 31) - 1  # the heap's free top is kept: trimming is left to release_freed()
ARENAS = 1  # every thread allocates from the same heap: what one thread frees, another reuses


class HeapStats(NamedTuple):
    """What the allocator holds (bytes): handed out (``in_use``, mapped blocks included) and freed but
    kept for reuse (``free``)."""

    in_use: int
    free: int


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def tuned() -> bool:
    """Whether this process runs with the tuning (``GRAPHSTORE_MALLOC=default`` turns it off)."""
    return os.environ.get("GRAPHSTORE_MALLOC", "").lower() != "default" and sys.platform.startswith("linux")


def keep_freed_memory() -> None:
    """Once per process (glibc only): serve batch-sized blocks from one heap and keep freed memory.

    Every batch allocates tens to hundreds of MB (sampler outputs, feature rows, the model's activations
    and gradients). glibc maps each block above its mmap threshold (at most 32 MB) fresh and unmaps it
    when freed, so the next batch takes a page fault per 4 KiB it writes: about 15% of sampling time,
    and half of a training epoch's time on a 100,000-node graph (README, Measured performance). With a
    1 GiB mmap threshold and no automatic trimming, freed blocks are reused instead. With one arena
    (``M_ARENA_MAX`` 1) every thread (the training loop, the prefetch thread, RPC threads) allocates
    from the same heap, so memory one thread frees is what the next batch of another reuses: without it
    each thread's arena kept its own freed memory and a rank's peak grew every epoch (3.6 GB vs 2.4 GB
    after 3 epochs on that graph). Call :func:`release_freed` between phases (the trainer does after
    every epoch) to hand kept memory back. Call this before the process starts threads: an arena a
    thread already has stays. Set ``GRAPHSTORE_MALLOC=default`` to leave the allocator alone.
    """
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    libc = _libc() if tuned() else None
    if libc is None:
        return
    try:
        ok = all(libc.mallopt(param, value) for param, value in (
            (_M_ARENA_MAX, ARENAS), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
    except AttributeError:  # not glibc
        return
    logger.debug("allocator tuned for batch-sized buffers (mallopt: %s)", "ok" if ok else "refused")


def release_freed() -> bool:
    """Hand the heap's freed memory back to the system (glibc ``malloc_trim``); True when some was.

    Costs a page fault per 4 KiB the next allocations touch again: call it between phases (an epoch's
    end), not per batch.
    """
    libc = _libc()
    try:
        return bool(libc.malloc_trim(0)) if libc is not None else False
    except AttributeError:  # not glibc
        return False


def heap_stats() -> HeapStats | None:
    """The allocator's own count of what it hands out and what it keeps freed (glibc >= 2.33
    ``mallinfo2``, every arena), ``None`` where there is no such call."""
    libc = _libc()
    try:
        call = libc.mallinfo2 if libc is not None else None
    except AttributeError:
        return None
    if call is None:
        return None
    call.restype = _MallInfo2
    info = call()
    return HeapStats(in_use=int(info.uordblks + info.hblkhd), free=int(info.fordblks))
