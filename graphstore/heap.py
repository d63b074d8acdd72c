"""This process's heap: tuned for batch-sized buffers (sampler outputs, gathered feature rows, a model's
activations), handed back between phases, and counted.

Library code of every layer calls :func:`keep_freed_memory` (a feature store, the sampler) and
:func:`release_freed` (an ingest between stages, the trainer between epochs). Which allocator a training
rank runs under (jemalloc preloaded by its launcher, or glibc tuned here) is ``training.launcher.allocator``'s
choice; ``GRAPHSTORE_MALLOC`` names it:

- unset or ``auto``: jemalloc where the launcher finds it, else glibc tuned by :func:`keep_freed_memory`;
- ``jemalloc``: as ``auto``, but a launcher that cannot find jemalloc stops with an error;
- ``glibc``: glibc tuned by :func:`keep_freed_memory`, no preload;
- ``default``: the allocator is left alone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from typing import NamedTuple

from graphstore.errors import InvalidInputError

logger = logging.getLogger(__name__)

_TUNED = False
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 1 << 30  # blocks below this come from the heap and are reused when freed
TRIM_THRESHOLD = (1 << 31) - 1  # the heap's free top is kept: trimming is left to release_freed()
ARENAS = 1  # every thread allocates from the same heap: what one thread frees, another reuses
MODES = ("auto", "jemalloc", "glibc", "default")
_MALLCTL_ARENAS_ALL = 4096  # jemalloc's "every arena" index in mallctl names


class HeapStats(NamedTuple):
    """What the allocator holds (bytes): handed out (``in_use``, mapped blocks included) and freed but
    kept for reuse (``free``)."""

    in_use: int
    free: int


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def mode(env: dict[str, str] | None = None) -> str:
    """``GRAPHSTORE_MALLOC`` (of ``env``, default this process's environment): one of :data:`MODES`."""
    value = (os.environ if env is None else env).get("GRAPHSTORE_MALLOC", "").strip().lower() or "auto"
    if value not in MODES:
        raise InvalidInputError(f"GRAPHSTORE_MALLOC={value!r} is not an allocator choice; use one of "
                                f"{', '.join(MODES)} (or unset it: auto)")
    return value


def tuned() -> bool:
    """Whether this process tunes glibc (not under jemalloc, and ``GRAPHSTORE_MALLOC`` is not ``default``).

    Library code asks this (a feature store, the sampler): a value it does not know is logged and read
    as ``auto`` here; the launcher and the ranks refuse it (:func:`preload_env`, :func:`check_rank`)."""
    try:
        chosen = mode()
    except InvalidInputError as exc:
        logger.warning("%s; tuning the allocator as for auto", exc)
        chosen = "auto"
    return chosen != "default" and sys.platform.startswith("linux") and not jemalloc_active()


@functools.lru_cache(maxsize=1)
def _mallctl() -> object | None:
    libc = _libc()
    try:
        call = libc.mallctl if libc is not None else None  # only jemalloc exports it unprefixed
    except AttributeError:
        return None
    if call is not None:
        call.restype = ctypes.c_int
        call.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return call


def jemalloc_active() -> bool:
    """Whether this process's ``malloc`` is jemalloc's (preloaded, see :func:`preload_env`)."""
    return _mallctl() is not None


def name() -> str:
    """The allocator this process runs with: ``jemalloc``, ``glibc-tuned`` or ``system``."""
    if jemalloc_active():
        return "jemalloc"
    return "glibc-tuned" if _TUNED and tuned() else "system"


def keep_freed_memory() -> None:
    """Once per process (glibc only): serve batch-sized blocks from one heap and keep freed memory.

    Every batch allocates tens to hundreds of MB (sampler outputs, feature rows, the model's activations
    and gradients). glibc maps each block above its mmap threshold (at most 32 MB) fresh and unmaps it
    when freed, so the next batch takes a page fault per 4 KiB it writes: about 15% of sampling time,
    and half of a training epoch's time on a 100,000-node graph (docs/performance.md). With a
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
    wanted = tuned()
    _TUNED = True
    libc = _libc() if wanted else None
    if libc is None:
        return
    try:
        ok = all(libc.mallopt(param, value) for param, value in (
            (_M_ARENA_MAX, ARENAS), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
    except AttributeError:  # not glibc
        return
    logger.debug("allocator tuned for batch-sized buffers (mallopt: %s)", "ok" if ok else "refused")


def release_freed() -> bool:
    """Hand the allocator's freed memory back to the system (glibc ``malloc_trim``; jemalloc: purge every
    arena); True when it was asked and did.

    Costs a page fault per 4 KiB the next allocations touch again: call it between phases (an epoch's
    end), not per batch.
    """
    mallctl = _mallctl()
    if mallctl is not None:
        return mallctl(f"arena.{_MALLCTL_ARENAS_ALL}.purge".encode(), None, None, None, 0) == 0
    libc = _libc()
    try:
        return bool(libc.malloc_trim(0)) if libc is not None else False
    except AttributeError:  # not glibc
        return False


def return_freed_promptly() -> bool:
    """For a process short of memory (features larger than RAM in a memory-limited rank): from now on hand
    freed memory back at once instead of keeping it for the next batch (jemalloc: dirty and muzzy decay
    0 ms in every arena; glibc: blocks of 32 MB and more are mapped and unmapped, and the heap's free top
    is trimmed above 64 MB). True when the allocator took it."""
    mallctl = _mallctl()
    if mallctl is not None:
        zero, size = ctypes.c_ssize_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
        count, count_size = ctypes.c_uint(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint))
        mallctl(b"arenas.narenas", ctypes.byref(count), ctypes.byref(count_size), None, 0)  # type: ignore[operator]
        keys = [f"arenas.{k}_decay_ms" for k in ("dirty", "muzzy")]  # arenas made later
        keys += [f"arena.{i}.{k}_decay_ms" for i in range(count.value) for k in ("dirty", "muzzy")]  # no "all" here
        done = [mallctl(k.encode(), None, None, ctypes.byref(zero), size) == 0 for k in keys]  # type: ignore[operator]
        return all(done)
    libc = _libc()
    try:
        return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
                    and libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20))
    except AttributeError:  # not glibc
        return False


def _jemalloc_stat(mallctl: object, key: str) -> int | None:
    value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    ok = mallctl(key.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0  # type: ignore[operator]
    return int(value.value) if ok else None


def heap_stats() -> HeapStats | None:
    """The allocator's own count of what it hands out and what it keeps freed (glibc >= 2.33
    ``mallinfo2``, every arena; jemalloc: ``stats.allocated`` and what it keeps resident beyond it),
    ``None`` where there is no such call."""
    mallctl = _mallctl()
    if mallctl is not None:
        stamp, size = ctypes.c_uint64(1), ctypes.c_size_t(8)
        mallctl(b"epoch", None, None, ctypes.byref(stamp), size)  # refresh jemalloc's cached counts
        allocated, resident = _jemalloc_stat(mallctl, "stats.allocated"), _jemalloc_stat(mallctl, "stats.resident")
        if allocated is None or resident is None:  # a build without statistics
            return None
        return HeapStats(in_use=allocated, free=max(0, resident - allocated))
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

