"""Memory-map the chunk files of an uncompressed, row-chunked Zarr array as one contiguous ndarray.

Each chunk file is mapped (copy-on-write, so a caller that writes to the array changes only its own
private pages, never the file and never a crash) at consecutive addresses of one reserved range, so
the whole array is a single zero-copy ``np.ndarray``: a gather is one numpy/torch fancy index and a
sampler kernel sees a plain array. Where chunk sizes are not page multiples (or the platform has no
``mmap(MAP_FIXED)``), chunks are mapped one by one and concatenated (a copy; logged once).
Remote arrays use the same range incrementally (:class:`SlotMap`): reserved at open, each chunk
mapped into its slot when it arrives in the local cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import sys
import weakref
from collections.abc import Sequence

import numpy as np

from graphstore.errors import CorruptDatasetError

logger = logging.getLogger(__name__)

_PROT_READ, _PROT_WRITE, _PROT_NONE = 0x1, 0x2, 0x0
_MAP_PRIVATE, _MAP_FIXED = 0x02, 0x10
_MAP_ANONYMOUS = 0x20 if sys.platform.startswith("linux") else 0x1000
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages): a PMD maps 2 MiB
_libc: ctypes.CDLL | None = None


def load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and os.name == "posix":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    return _libc


def _mmap(addr: int | None, length: int, prot: int, flags: int, fd: int) -> int:
    libc = load_libc()
    assert libc is not None  # callers check load_libc() first
    out = libc.mmap(addr, length, prot, flags, fd, 0)
    if out is None or out == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return int(out)


def advise_huge_pages(array: np.ndarray) -> None:
    """Ask the kernel to map ``array``'s pages 2 MiB at a time (``MADV_HUGEPAGE``; Linux, else nothing).

    For a file mapping this must come before the first read: a page-cache miss under the advice reads a
    whole 2 MiB folio, which a fault then maps with one page-table entry (where the filesystem has large
    folios, as ext4 and XFS do). Read first, the cache holds small folios and the mapping stays 4 KiB
    pages: the sampler, which reads its topology at random, then misses the TLB at nearly every node.
    Only for arrays that are read at random and meant to stay resident (topology, derived arrays): a miss
    reads 2 MiB from disk.
    """
    libc = load_libc()
    if libc is None or array.nbytes < HUGE_PAGE or not sys.platform.startswith("linux"):
        return
    start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(array.ctypes.data + array.nbytes - start), _MADV_HUGEPAGE)


def map_chunks(paths: Sequence[str | None], shape: tuple[int, ...], dtype: np.dtype, chunk_rows: int,
               where: str, huge: bool = False) -> np.ndarray:
    """Return the array stored row-chunked in ``paths`` (``None`` = an absent chunk, read as zeros);
    ``huge``: advised for huge pages before anything reads it (:func:`advise_huge_pages`).

    Raises :class:`CorruptDatasetError` naming the chunk when a chunk file is shorter than a chunk.
    """
    dtype = np.dtype(dtype)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    chunk_bytes = chunk_rows * row_bytes
    for i, path in enumerate(paths):
        if path is not None and os.path.getsize(path) < chunk_bytes:
            raise CorruptDatasetError(
                f"{where}: chunk {i} ({path}) holds {os.path.getsize(path)} bytes, expected {chunk_bytes}: "
                "the file is truncated; run `graphstore verify` and re-ingest (or clear the cache)"
            )
    if shape[0] == 0 or row_bytes == 0:
        return np.zeros(shape, dtype)
    if len(paths) == 1 and paths[0] is not None:
        array = np.memmap(paths[0], dtype=dtype, mode="c", shape=shape)
        if huge:
            advise_huge_pages(array)
        return array
    if chunk_bytes % mmap.PAGESIZE == 0 and load_libc() is not None:
        return _map_contiguous(paths, shape, dtype, chunk_bytes, huge)
    logger.info("%s: chunks of %d bytes are not page multiples; reading them into memory", where, chunk_bytes)
    parts = [np.memmap(p, dtype=np.uint8, mode="r", shape=(chunk_bytes,)) if p else np.zeros(chunk_bytes, np.uint8)
             for p in paths]
    flat = np.concatenate(parts)[: shape[0] * row_bytes]
    return flat.view(dtype).reshape(shape)


def _map_contiguous(paths: Sequence[str | None], shape: tuple[int, ...], dtype: np.dtype,
                    chunk_bytes: int, huge: bool) -> np.ndarray:
    slots = SlotMap(len(paths), chunk_bytes, shape, dtype)
    for i, path in enumerate(paths):
        if path is None:
            slots.map_zeros(i)
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            slots.map(i, fd)
        finally:
            os.close(fd)
    if huge:
        advise_huge_pages(slots.array)
    return slots.array


def can_map_slots(num_chunks: int, chunk_bytes: int) -> bool:
    """Whether chunks of ``chunk_bytes`` can be mapped back to back (page multiples, or a single chunk)."""
    return (num_chunks == 1 or chunk_bytes % mmap.PAGESIZE == 0) and load_libc() is not None


class SlotMap:
    """One reserved address range of ``num_chunks`` slots, each mapped to a chunk file when it arrives.

    ``array`` is the whole array as one ``np.ndarray`` from the start. Slots not yet mapped are
    ``PROT_NONE``: touching one is a segmentation fault, so a caller maps (:meth:`map`) every slot a read
    needs before indexing (``present`` says which are mapped). Mapped slots are copy-on-write private
    pages of the file; they stay valid after the file is deleted, until the last view of ``array`` is gone.
    """

    def __init__(self, num_chunks: int, chunk_bytes: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        dtype = np.dtype(dtype)
        span = -(-chunk_bytes * num_chunks // mmap.PAGESIZE) * mmap.PAGESIZE
        self.chunk_bytes = chunk_bytes
        self.present = np.zeros(num_chunks, dtype=bool)
        # Aligned to 2 MiB (when that large), so chunk files (whole 2 MiB multiples at the default
        # size) can be mapped with huge pages where the kernel offers them (see topology.prefault).
        align = HUGE_PAGE if span >= HUGE_PAGE else mmap.PAGESIZE
        reserved = _mmap(None, span + align - mmap.PAGESIZE, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1)
        self._base = -(-reserved // align) * align
        buffer = (ctypes.c_char * span).from_address(self._base)
        # unmapped when the last array view is gone
        weakref.finalize(buffer, _unmap, reserved, span + align - mmap.PAGESIZE)
        count = shape[0] * int(np.prod(shape[1:], dtype=np.int64))
        self.array = np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)

    def map(self, index: int, fd: int) -> None:
        """Map the chunk file open at ``fd`` into slot ``index`` (copy-on-write: writes stay private)."""
        if not self.present[index]:
            _mmap(self._base + index * self.chunk_bytes, self.chunk_bytes, _PROT_READ | _PROT_WRITE,
                  _MAP_PRIVATE | _MAP_FIXED, fd)
            self.present[index] = True

    def map_zeros(self, index: int) -> None:
        """Fill slot ``index`` with zero pages (an absent chunk reads as the fill value)."""
        _mmap(self._base + index * self.chunk_bytes, self.chunk_bytes, _PROT_READ | _PROT_WRITE,
              _MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS, -1)
        self.present[index] = True


def _unmap(base: int, total: int) -> None:
    libc = load_libc()
    if libc is not None:
        libc.munmap(base, total)
