"""Rows of a stored array read with direct I/O: no page cache, many reads in flight, a RAM cache of hot rows.

:class:`~graphstore.storage.diskrows.DiskRows` reads features larger than memory through the memory map, so
every row it reads lands in the page cache first. Where the page cache is charged to the job (a cgroup
memory limit, as under SLURM or Kubernetes), the training thread's own allocations then have to reclaim
those pages first, and a limit that leaves room for the rank's working set can still end in the OOM
killer. :class:`DirectRows` opens the chunk files with ``O_DIRECT``: each read goes from the disk into a
small aligned buffer and is copied into the batch's rows (or, for rows of whole blocks next to each other on
disk and in the batch, into the batch's rows themselves), so the memory a gather uses is the batch's rows
plus those buffers, whatever the dataset's size. Rows close together are read by one call. The reads in
flight (the disk's queue depth) come from an io_uring of the gathering thread (:mod:`graphstore.storage.uring`:
``ring`` entries, one system call a round, no GIL), or where the kernel offers none from ``threads`` threads
each reading a piece of the batch. At the same depth the threads read faster, but the disk saturates at
about the same rate either way and the ring costs less than half the CPU time per row
(``tools/bench_disk_reads.py``), which the training step beside it needs on a machine of few cores.

Where the file system refuses ``O_DIRECT`` (tmpfs, some network file systems) :func:`direct_rows` returns
``None`` and the caller keeps the page-cache path.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

if TYPE_CHECKING:
    import torch

from graphstore.errors import CorruptDatasetError
from graphstore.storage.diskrows import DiskRows, GatherCounts, RowReader, SharedReader
from graphstore.storage import uring
from graphstore.storage.fileio import ChunkFiles, close_files, pread_into

ALIGN = 4096  # O_DIRECT wants the buffer, the file offset and the length aligned to the device's block
GAP_ALIGNED = 1  # rows at most this many blocks apart are read by one call
SPAN_BYTES = 1 << 18  # the most one call reads (each thread's buffer)
RING = 128  # reads in flight through the io_uring: past this depth the disk gave no more rows/s
THREADS = 64  # reads in flight without io_uring: threads, each its own read at a time


def direct_rows(files: ChunkFiles, mapped: Any = None, hot: np.ndarray | None = None, where: str = "",
                threads: int = THREADS, direct: bool = True, ring: int = RING) -> DirectRows | None:
    """:class:`DirectRows` over ``files``, or ``None`` where the file system refuses ``O_DIRECT``. ``direct``
    false: the same reads and cache through the page cache (for a file system that refuses direct I/O when
    there is no mapping to read through instead)."""
    fds = open_direct(files, direct)
    if fds is None:
        return None
    reader = DirectRows(files, fds, mapped, hot, where, threads, ring)
    reader.kind = "direct" if direct else "pread"
    return reader


def reopen(shared: SharedReader, files: ChunkFiles, rows: Any) -> RowReader:
    """The reader ``shared`` describes (:meth:`~graphstore.storage.diskrows.RowReader.shared`: another
    process's), rebuilt in this one over ``files`` and ``rows`` (the array mapped, or read unmapped), its
    hot rows served from the same cache; through the page cache (:class:`DiskRows`) where this file
    system refuses the direct reads the other process made."""
    reader = None
    if shared.kind in ("direct", "pread"):
        reader = direct_rows(files, rows, None, shared.where, direct=shared.kind == "direct")
    if reader is None:
        reader = DiskRows(rows, None, shared.where) if isinstance(rows, np.ndarray) else \
            direct_rows(files, rows, None, shared.where, direct=False)
    reader.adopt(shared)
    return reader


def open_direct(files: ChunkFiles, direct: bool = True) -> list[int] | None:
    """``files``' chunks opened again with ``O_DIRECT`` (-1 for an absent chunk), or ``None`` where the file
    system refuses it (or the platform has no ``O_DIRECT``); ``direct`` false: opened plainly."""
    flag = getattr(os, "O_DIRECT", 0) if direct else 0
    if direct and not flag:
        return None
    fds: list[int] = []
    try:
        for path in files.paths:
            fds.append(-1 if path is None else os.open(path, os.O_RDONLY | flag | getattr(os, "O_CLOEXEC", 0)))
    except OSError as exc:
        close_files(fds)
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise CorruptDatasetError(f"{files.where}: cannot open a chunk file ({exc}); run `graphstore verify` on "
                                  "the dataset") from exc
    probe = next((fd for fd in fds if fd >= 0), -1)
    if probe >= 0 and direct:  # some file systems accept the flag at open and refuse the first read
        buf = _aligned(ALIGN)
        try:
            os.preadv(probe, [memoryview(buf)], 0)
        except OSError as exc:
            close_files(fds)
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return None
            raise
    return fds


class DirectRows(RowReader):
    """Rows of a stored array (row-chunked, uncompressed, local) as a batch needs them: ``hot`` rows (row
    numbers) read once into RAM and served from there, the others read with ``O_DIRECT`` through an io_uring
    of ``ring`` entries per gathering thread, or (``ring`` 0, or no io_uring here) by ``threads`` threads.
    ``fds``: the chunk files opened by :func:`open_direct` (this object closes them); ``mapped``: the same
    array mapped (what ``np.asarray(rows)`` and non-integer indexing read). ``rows[ids]`` returns what
    ``mapped[ids]`` holds.
    """

    kind = "direct"  # as SharedReader names it ("pread": files opened without O_DIRECT)

    def __init__(self, files: ChunkFiles, fds: list[int], mapped: Any = None, hot: np.ndarray | None = None,
                 where: str = "", threads: int = THREADS, ring: int = RING) -> None:
        self.files, self.mapped, self.where = files, mapped, where or files.where
        self.shape, self.dtype, self.row_bytes = files.shape, files.dtype, files.row_bytes
        self.fds = np.array(fds, np.int64)
        self._closer = weakref.finalize(self, close_files, list(fds))
        self._local = threading.local()
        self.ring = int(ring)  # reads in flight through an io_uring of the gathering thread; 0: the threads
        if self.ring and _ring_of(self) is None:
            self.ring = 0  # no io_uring here (an old kernel, a sandbox): the thread pool reads
        threads = 1 if self.ring else threads
        self.threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="direct-rows") if self.threads > 1 else None
        if self._pool is not None:
            weakref.finalize(self, self._pool.shutdown, wait=False)
        self.counts = GatherCounts()
        self.keep_hot(hot)

    def _read_hot(self, hot: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        return self.gather(hot, out)  # read like any batch's rows, then kept

    def _words_of(self, cache: torch.Tensor) -> Any:
        return cache.numpy().reshape(len(cache), -1).view(np.uint8)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.mapped, dtype)

    def gather(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (row numbers, in range) as a tensor, in order (into ``out`` when given: a contiguous
        tensor of their shape)."""
        import torch

        started = time.perf_counter()
        if out is None:
            flat = _batch_buffer(len(ids) * self.row_bytes, self.row_bytes)
            out = torch.from_numpy(flat.view(self.dtype).reshape(len(ids), *self.shape[1:]))
        else:
            flat = out.numpy().reshape(-1).view(np.uint8)
        hits, state = 0, self._hot  # read once: the cache may be replaced meanwhile
        if state.slot_of is not None and len(ids):
            slots = state.slot_of[ids]
            hits = int(np.count_nonzero(slots >= 0))
            if hits:
                _copy_hits(state.words, slots, flat, self.row_bytes)
            wanted = np.flatnonzero(slots < 0)
        else:
            wanted = np.arange(len(ids), dtype=np.int64)
        read = self._read(ids, wanted, flat) if len(wanted) else 0
        self.counts.add_counted(len(ids), hits, read, time.perf_counter() - started)
        return out

    def _read(self, ids: np.ndarray, wanted: np.ndarray, flat: np.ndarray) -> int:
        """Rows ``ids[wanted]`` from disk into their places of ``flat``; returns the bytes read."""
        order = wanted[np.argsort(ids[wanted], kind="stable")]  # positions, by row number
        rows = ids[order]
        ring = _ring_of(self) if self.ring else None
        if ring is not None:
            got = uring.read_sorted(*ring.args(), self.fds, self.files.chunk_rows, self.row_bytes, rows,
                                    order, flat, GAP_ALIGNED * ALIGN)
            if got == -2:  # the ring's waits kept failing, reads possibly still in flight: never use it again
                self._local.pid = None
                raise OSError(f"{self.where}: io_uring reads kept failing (interrupted waits); the next gather of "
                              "this thread sets up a new ring")
            if got < 0:
                raise CorruptDatasetError(f"{self.where}: a direct read came back short (a truncated chunk file or "
                                          "a failing disk); run `graphstore verify` on the dataset")
            return int(got)
        pieces = _pieces(rows, self.threads if self._pool is not None else 1)
        if len(pieces) <= 2:  # one piece
            got = _read_sorted(self.fds, self.files.chunk_rows, self.row_bytes, rows, order, flat, self._buffer())
        else:
            bounds = list(zip(pieces[:-1], pieces[1:]))
            results = list(self._pool.map(
                lambda b: _read_sorted(self.fds, self.files.chunk_rows, self.row_bytes, rows[b[0]:b[1]],
                                       order[b[0]:b[1]], flat, self._buffer()), bounds))
            got = -1 if any(r < 0 for r in results) else sum(results)
        if got < 0:
            raise CorruptDatasetError(f"{self.where}: a direct read came back short (a truncated chunk file or a "
                                      "failing disk); run `graphstore verify` on the dataset")
        return int(got)

    def _buffer(self) -> np.ndarray:
        """This thread's aligned read buffer (one per thread, reused by every gather)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = _aligned(max(SPAN_BYTES, -(-2 * self.row_bytes // ALIGN) * ALIGN + ALIGN))
        return buf

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("DirectRows holds open files and threads of this process; open the dataset in the other "
                        "process instead")


def _ring_of(reader: DirectRows) -> Any:
    """The calling thread's io_uring for ``reader`` (made on first use, and anew in a forked child: a ring
    is never shared by two processes), or ``None`` where there is none (the caller reads with threads)."""
    local = reader._local
    if getattr(local, "pid", None) != os.getpid():
        slot = max(SPAN_BYTES // 4, -(-2 * reader.row_bytes // ALIGN) * ALIGN + ALIGN)  # a row straddling blocks fits
        local.ring, local.pid = uring.open_ring(reader.ring, slot), os.getpid()
    return local.ring


def _pieces(rows: np.ndarray, parts: int) -> list[int]:
    """Bounds cutting the sorted ``rows`` into up to ``parts`` pieces, never inside a run of one row."""
    n = len(rows)
    if parts <= 1 or n < 2 * parts:
        return [0, n]
    cuts = [0]
    for p in range(1, parts):
        at = p * n // parts
        while 0 < at < n and rows[at] == rows[at - 1]:
            at += 1
        if cuts[-1] < at < n:
            cuts.append(at)
    return cuts + [n]


def _batch_buffer(nbytes: int, row_bytes: int) -> np.ndarray:
    """A gather's output bytes: page-aligned when rows are whole blocks, so that reads of rows next to each
    other go straight into it (:func:`~graphstore.storage.uring.direct_run`); not zeroed."""
    if row_bytes % ALIGN or nbytes == 0:
        return np.empty(nbytes, np.uint8)
    spare = np.empty(nbytes + ALIGN, np.uint8)
    skip = -spare.ctypes.data % ALIGN
    return spare[skip:skip + nbytes]


def _aligned(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of ``nbytes`` whose address is a multiple of the page size."""
    region = mmap.mmap(-1, nbytes)  # anonymous mappings start on a page
    return np.frombuffer(region, dtype=np.uint8, count=nbytes)


@njit(cache=True, nogil=True)
def _copy_hits(cache, slots, out, row_bytes):  # pragma: no cover - compiled
    for i in range(len(slots)):
        s = slots[i]
        if s >= 0:
            out[i * row_bytes:(i + 1) * row_bytes] = cache[s, :]


@njit(cache=True, nogil=True)
def _read_sorted(fds, chunk_rows, row_bytes, rows, order, out, buf):  # pragma: no cover - compiled
    """Rows ``rows`` (ascending; ``order[i]`` the output row of ``rows[i]``) read with aligned calls into
    ``buf`` (page-aligned) and copied into ``out`` (bytes, ``row_bytes`` a row), or where
    :func:`~graphstore.storage.uring.direct_run` allows into ``out`` itself: rows of one chunk at most
    ``GAP_ALIGNED`` blocks apart share a call, up to ``len(buf)`` bytes. Returns the bytes read, -1 on a
    short read."""
    n, i, total, out_addr = len(rows), 0, np.int64(0), np.int64(out.ctypes.data)
    while i < n:
        c, first, j, end = uring.aligned_run(rows, i, chunk_rows, row_bytes, GAP_ALIGNED * ALIGN, len(buf))
        length = -(-(end - first) // ALIGN) * ALIGN
        direct = fds[c] >= 0 and uring.direct_run(rows, order, i, j, row_bytes, out_addr)
        into, at = (out, order[i] * row_bytes) if direct else (buf, 0)  # the batch's rows themselves, or buf
        if fds[c] < 0:
            buf[:end - first] = 0
        else:
            got = np.int64(-1)
            for _ in range(3):  # a signal may interrupt a read: tried again
                got = pread_into(fds[c], into, at, length, first)
                if got >= end - first:  # the chunk's last block may be short: what is needed is there
                    break
            if got < end - first:
                return -1
            total += got
        if direct:
            i = j + 1
            continue
        for q in range(i, j + 1):
            src = (rows[q] - c * chunk_rows) * row_bytes - first
            dst = order[q] * row_bytes
            out[dst:dst + row_bytes] = buf[src:src + row_bytes]
        i = j + 1
    return total
