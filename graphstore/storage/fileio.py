"""Stored arrays read with ``pread`` into the reader's own buffers, never mapped.

A mapped page a process has read counts in its resident set for as long as the mapping lives, so a
rank that samples and gathers over a mapped partition holds, by the end of an epoch, about every page
of it: its resident set grows with the graph. Read with ``pread``, the same bytes come from the page
cache (shared, dropped under pressure) into buffers the size of a batch. Each read is a system call
(about a microsecond), so the readers here coalesce neighbouring rows into one read.

- :class:`ChunkFiles`: one array's chunk files, open, with its row geometry;
- :func:`read_span`: rows of such an array into a numba array (the sampling kernels call it);
- :class:`FileRows`: rows of such an array as a feature store gathers them (``rows[ids]``), counted.
"""

from __future__ import annotations

import errno
import os
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

if TYPE_CHECKING:
    import torch

from graphstore.errors import CorruptDatasetError, InvalidInputError
from graphstore.storage.diskrows import GatherCounts

GAP_BYTES = 4096  # rows at most this far apart are read in one call (a call costs what copying ~8 KB does)
SPAN_BYTES = 1 << 16  # the most one coalesced read of rows spans


@intrinsic
def pread_into(typingctx, fd, array, index, nbytes, offset):
    """``pread(fd, &array[index], nbytes, offset)``: bytes read, or -1. The C function is named, not
    addressed, so the kernels calling it stay cacheable."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[1]
        ary = context.make_array(aryty)(context, builder, args[1])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[2]], wraparound=False)
        ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [ir.IntType(32), ptr.type, i64, i64])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "pread")
        return builder.call(fn, [builder.trunc(args[0], ir.IntType(32)), ptr, args[3], args[4]])

    return types.int64(fd, array, index, nbytes, offset), codegen


@njit(cache=True, nogil=True)
def read_span(fds, chunk_rows, row_bytes, row, count, out, at, per_row):
    """Rows ``[row, row + count)`` of an array stored in chunks of ``chunk_rows`` rows (``fds[c]``: chunk
    ``c``'s file, -1 for an absent chunk, read as zeros) into ``out[at:]``, ``per_row`` elements of
    ``out`` a row. False when a read came back short (a truncated or failing file)."""
    while count > 0:
        c = row // chunk_rows
        within = row - c * chunk_rows
        n = min(count, chunk_rows - within)
        nbytes = n * row_bytes
        if fds[c] < 0:
            out[at:at + n * per_row] = 0
        else:
            got = np.int64(-1)
            for _ in range(3):  # a signal may interrupt a read: tried again
                got = pread_into(fds[c], out, at, nbytes, within * row_bytes)
                if got == nbytes:
                    break
            if got != nbytes:
                return False
        row += n
        count -= n
        at += n * per_row
    return True


class ChunkFiles:
    """The chunk files of one stored array (row-chunked, uncompressed, local), open for reading.

    ``fds[c]`` is chunk ``c``'s descriptor (-1: an absent chunk, all zeros). The files close when the
    object is collected; it pickles by its paths and reopens them.
    """

    def __init__(self, paths: Sequence[str | None], shape: tuple[int, ...], dtype: Any, chunk_rows: int,
                 where: str) -> None:
        self.paths, self.shape, self.dtype = list(paths), tuple(int(s) for s in shape), np.dtype(dtype)
        self.chunk_rows, self.where = int(chunk_rows), where
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        self._open()

    def _open(self) -> None:
        _allow_open_files()
        fds = []
        try:
            for path in self.paths:
                fds.append(-1 if path is None else os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except OSError as exc:
            close_files(fds)
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise InvalidInputError(f"{self.where}: too many open files to read its {len(self.paths)} chunks "
                                        "without mapping them; raise the limit (`ulimit -n`), or leave the dataset "
                                        "mapped") from exc
            raise CorruptDatasetError(f"{self.where}: cannot open a chunk file ({exc}); run `graphstore verify` "
                                      "on the dataset") from exc
        self.fds = np.array(fds, np.int64)
        self._closer = weakref.finalize(self, close_files, fds)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("fds", "_closer")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, row: int, count: int, out: np.ndarray) -> np.ndarray:
        """Rows ``[row, row + count)`` into ``out`` (contiguous, ``count`` rows of this array's bytes)."""
        flat = out.reshape(-1).view(np.uint8)
        if count and not read_span(self.fds, self.chunk_rows, self.row_bytes, row, count, flat, 0, self.row_bytes):
            raise CorruptDatasetError(f"{self.where}: reading rows {row}..{row + count - 1} came back short (a "
                                      "truncated chunk file or a failing disk); run `graphstore verify` on the dataset")
        return out


def _allow_open_files() -> None:
    """Raise this process's soft limit on open files to its hard limit (once): an unmapped partition keeps
    every chunk file open, a few thousand for a large one, against a soft limit of often 1,024."""
    global _LIMIT_RAISED
    if _LIMIT_RAISED:
        return
    _LIMIT_RAISED = True
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ImportError, ValueError, OSError):
        pass


_LIMIT_RAISED = False


def close_files(fds: list[int]) -> None:
    """Close the descriptors ``fds`` (-1: none), ignoring errors (a finalizer's clean-up)."""
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


@njit(cache=True, nogil=True)
def _gather_rows(fds, chunk_rows, row_bytes, ids, order, out, scratch):  # pragma: no cover - compiled
    """Rows ``ids`` (visited in ``order``: ascending) into ``out`` (bytes, ``row_bytes`` a row, in the order of
    ``ids``): rows close together are read by one call into ``scratch`` and copied out. False on a short read."""
    n, i = len(order), 0
    while i < n:
        first = ids[order[i]]
        j = i
        while j + 1 < n and (ids[order[j + 1]] - ids[order[j]]) * row_bytes <= GAP_BYTES \
                and (ids[order[j + 1]] - first + 1) * row_bytes <= len(scratch):
            j += 1
        if j == i:
            if not read_span(fds, chunk_rows, row_bytes, first, 1, out, order[i] * row_bytes, row_bytes):
                return False
        else:
            if not read_span(fds, chunk_rows, row_bytes, first, ids[order[j]] - first + 1, scratch, 0, row_bytes):
                return False
            for q in range(i, j + 1):
                src, dst = (ids[order[q]] - first) * row_bytes, order[q] * row_bytes
                out[dst:dst + row_bytes] = scratch[src:src + row_bytes]
        i = j + 1
    return True


class FileRows:
    """A stored array's rows as ``rows[ids]`` reads them (a feature store's gather), by ``pread``.

    Integer indices are sorted, neighbouring rows read together, and the rows returned in the order
    asked. Counters say how many rows were gathered, the bytes this thread caused to be read from
    storage and the seconds spent (:meth:`snapshot`), as :class:`~graphstore.storage.diskrows.DiskRows`'s.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "c0"
    >>> np.arange(12, dtype=np.float32).reshape(6, 2).tofile(path)
    >>> rows = FileRows(ChunkFiles([str(path)], (6, 2), np.float32, 6, "x"))
    >>> rows[np.array([4, 1])].tolist()
    [[8.0, 9.0], [2.0, 3.0]]
    """

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        self.shape, self.dtype, self.row_bytes = files.shape, files.dtype, files.row_bytes
        self.counts = GatherCounts()

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def cache_bytes(self) -> int:
        return 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.files.read(0, len(self), np.empty(self.shape, self.dtype))
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            row = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= row < len(self):
                raise IndexError(f"{self.files.where}: row {int(index)} is out of range for {len(self)} rows")
            return self.files.read(row, 1, np.empty((1, *self.shape[1:]), self.dtype))[0]
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step == 1:
                return self.files.read(lo, max(hi - lo, 0), np.empty((max(hi - lo, 0), *self.shape[1:]), self.dtype))
            index = np.arange(lo, hi, step)
        ids = np.asarray(index)
        if ids.dtype == bool:
            ids = np.flatnonzero(ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            return np.asarray(self)[index]
        ids = ids.astype(np.int64, copy=False)
        if len(ids) and (ids.min() < -len(self) or ids.max() >= len(self)):
            raise IndexError(f"{self.files.where}: rows {ids[(ids < -len(self)) | (ids >= len(self))][:5].tolist()} "
                             f"are out of range for {len(self)} rows")
        return self.gather(np.where(ids < 0, ids + len(self), ids)).numpy()

    def gather(self, ids: np.ndarray) -> torch.Tensor:
        """Rows ``ids`` (row numbers in range, int64) as a tensor, in order."""
        import torch  # here: opening a dataset (the launcher's checks) needs no torch

        since = self.counts.start()
        out = torch.empty((len(ids), *self.shape[1:]), dtype=torch.from_numpy(np.empty(0, self.dtype)).dtype)
        if len(ids) and self.row_bytes:
            order = np.argsort(ids, kind="stable")
            scratch = np.empty(max(SPAN_BYTES, self.row_bytes), np.uint8)
            flat = out.numpy().reshape(-1).view(np.uint8)
            f = self.files
            if not _gather_rows(f.fds, f.chunk_rows, f.row_bytes, ids, order, flat, scratch):
                raise CorruptDatasetError(f"{f.where}: a read of {len(ids)} rows came back short (a truncated chunk "
                                          "file or a failing disk); run `graphstore verify` on the dataset")
        self.counts.add(len(ids), 0, since)
        return out

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        """``rows`` gathered, ``hits`` (always 0: no cache), ``disk_bytes`` read from storage and ``read_seconds``
        spent gathering, since the last reset."""
        return self.counts.snapshot(reset)
