"""Memory-map the chunk files of an uncompressed, row-chunked Zarr array as one contiguous ndarray.

Each chunk file is mapped (copy-on-write, so a caller that writes to the array changes only its own
private pages, never the file and never a crash) at consecutive addresses of one reserved range, so
the whole array is a single zero-copy ``np.ndarray``: a gather is one numpy/torch fancy index and a
sampler kernel sees a plain array. Where chunk sizes are not page multiples (or the platform has no
``mmap(MAP_FIXED)``), chunks are mapped one by one and concatenated (a copy; logged once).
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
_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
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
    libc = _load_libc()
    assert libc is not None  # callers check _load_libc() first
    out = libc.mmap(addr, length, prot, flags, fd, 0)
    if out is None or out == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return int(out)


def map_chunks(paths: Sequence[str | None], shape: tuple[int, ...], dtype: np.dtype, chunk_rows: int,
               where: str) -> np.ndarray:
    """Return the array stored row-chunked in ``paths`` (``None`` = an absent chunk, read as zeros).

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
        return np.memmap(paths[0], dtype=dtype, mode="c", shape=shape)
    if chunk_bytes % mmap.PAGESIZE == 0 and _load_libc() is not None:
        return _map_contiguous(paths, shape, dtype, chunk_bytes)
    logger.info("%s: chunks of %d bytes are not page multiples; reading them into memory", where, chunk_bytes)
    parts = [np.memmap(p, dtype=np.uint8, mode="r", shape=(chunk_bytes,)) if p else np.zeros(chunk_bytes, np.uint8)
             for p in paths]
    flat = np.concatenate(parts)[: shape[0] * row_bytes]
    return flat.view(dtype).reshape(shape)


def _map_contiguous(paths: Sequence[str | None], shape: tuple[int, ...], dtype: np.dtype,
                    chunk_bytes: int) -> np.ndarray:
    total = chunk_bytes * len(paths)
    base = _mmap(None, total, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1)
    buffer = (ctypes.c_char * total).from_address(base)
    weakref.finalize(buffer, _unmap, base, total)  # unmapped when the last array view is gone
    prot = _PROT_READ | _PROT_WRITE  # copy-on-write: writes stay private to this process
    for i, path in enumerate(paths):
        addr = base + i * chunk_bytes
        if path is None:
            _mmap(addr, chunk_bytes, prot, _MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS, -1)
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            _mmap(addr, chunk_bytes, prot, _MAP_PRIVATE | _MAP_FIXED, fd)
        finally:
            os.close(fd)
    count = shape[0] * int(np.prod(shape[1:], dtype=np.int64))
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _unmap(base: int, total: int) -> None:
    libc = _load_libc()
    if libc is not None:
        libc.munmap(base, total)
