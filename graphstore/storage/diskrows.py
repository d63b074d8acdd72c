"""Rows of a memory-mapped array larger than memory: hot rows in RAM, the rest read from disk in parallel.

A batch's feature rows are scattered over a file much larger than the page cache can hold. Left to
page faults, each missing row costs one synchronous read (queue depth 1) plus the kernel's read-around
of the pages beside it, which evicts rows other batches need. :class:`DiskRows` wraps the mapped
array and, for each gather:

- serves the rows of a RAM cache (the hottest rows, chosen by the caller, up to a byte budget);
- sorts the other rows, coalesces neighbouring pages into ranges, and asks the kernel for all of
  them at once (``madvise(MADV_WILLNEED)``: the reads go out together, at a deep queue), then copies;
- marks the mapping ``MADV_RANDOM`` so a fault reads its page, not the pages around it.

Pages already in the page cache cost only the ``madvise`` walk, so what the kernel does well (rows
that fit in memory) it keeps doing. Counters say how many rows came from the cache, how many bytes
this process read from disk (``/proc/thread-self/io``) and the seconds spent gathering.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

if TYPE_CHECKING:  # imported where rows become tensors: opening a dataset needs no torch
    import torch

from graphstore.storage.mapped import load_libc

logger = logging.getLogger("graphstore")
_MADV_RANDOM, _MADV_WILLNEED = 1, 3
GAP_PAGES = 2  # pages between two wanted ranges that are read with them (one larger read beats two)


def thread_read_bytes() -> int | None:
    """Bytes this thread has caused to be read from storage (Linux), or ``None``."""
    try:
        with open("/proc/thread-self/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class GatherCounts:
    """What a row reader gathered since the last reset, thread-safe: ``rows``, ``hits`` (from a RAM cache),
    ``disk_bytes`` (what the gathering threads caused to be read from storage) and ``read_seconds``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = self._zero()
        self._quiet = threading.local()  # this thread's gathers are not counted (a reader filling its cache)

    @staticmethod
    def _zero() -> dict[str, Any]:
        return dict(rows=0, hits=0, disk_bytes=0, read_seconds=0.0)

    @staticmethod
    def start() -> tuple[float, int | None]:
        """The clock and this thread's bytes read, before a gather."""
        return time.perf_counter(), thread_read_bytes()

    def add(self, rows: int, hits: int, since: tuple[float, int | None]) -> None:
        """Count a gather of ``rows`` rows, ``hits`` of them from a cache, begun at ``since`` (:meth:`start`)."""
        if getattr(self._quiet, "on", False):
            return
        started, read0 = since
        read1 = thread_read_bytes()
        with self._lock:
            c = self._counts
            c["rows"] += rows
            c["hits"] += hits
            c["disk_bytes"] += (read1 - read0) if read0 is not None and read1 is not None else 0
            c["read_seconds"] += time.perf_counter() - started

    def add_counted(self, rows: int, hits: int, disk_bytes: int, seconds: float) -> None:
        """Count a gather whose reader counted its bytes itself (direct reads: what it read is what the disk did)."""
        if getattr(self._quiet, "on", False):
            return
        with self._lock:
            c = self._counts
            c["rows"] += rows
            c["hits"] += hits
            c["disk_bytes"] += disk_bytes
            c["read_seconds"] += seconds

    @contextlib.contextmanager
    def muted(self) -> Any:
        """Within it, this thread's gathers are not counted (other threads' still are)."""
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = False

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        """The counts since the last reset (``read_seconds`` rounded to ms)."""
        with self._lock:
            out = dict(self._counts)
            if reset:
                self._counts = self._zero()
        out["read_seconds"] = round(out["read_seconds"], 3)
        return out


def _madvise() -> Any:
    libc = load_libc()
    if libc is None or not hasattr(libc, "madvise"):
        return None
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def page_ranges(rows: np.ndarray, row_bytes: int, gap: int = GAP_PAGES) -> tuple[np.ndarray, np.ndarray]:
    """The page ranges ``[first, last]`` (inclusive) holding ``rows`` (sorted, unique) of an array at
    a page-aligned address, merged where at most ``gap`` pages lie between two of them.

    >>> page_ranges(np.array([0, 1, 5, 40]), 4096, gap=2)
    (array([ 0,  5, 40]), array([ 1,  5, 40]))
    >>> page_ranges(np.array([0, 2, 40]), 4096, gap=2)
    (array([ 0, 40]), array([ 2, 40]))
    """
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = rows * row_bytes // mmap.PAGESIZE
    last = ((rows + 1) * row_bytes - 1) // mmap.PAGESIZE
    new = np.empty(len(rows), bool)
    new[0] = True
    new[1:] = first[1:] > last[:-1] + gap + 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:] - 1, len(rows) - 1)
    return first[starts], last[ends]


class SharedReader(NamedTuple):
    """A row reader as another process of the rank rebuilds it (:meth:`RowReader.shared`): its kind
    (``"direct"``: :class:`~graphstore.storage.directrows.DirectRows` with ``O_DIRECT``; ``"pread"``: the same
    without; ``"mapped"``: :class:`DiskRows`), its hot rows (row numbers, sorted) and their cache (a tensor in
    shared memory, or ``None``), and where it reads (for messages)."""

    kind: str
    hot: np.ndarray
    cache: Any
    where: str


class HotRows(NamedTuple):
    """A row reader's RAM cache as one value, replaced whole: a gather reads it once, so it never pairs one
    cache's slots with another's rows, and a cache being replaced stays alive until the gathers reading it end.
    ``hot``: row numbers (sorted); ``cache``: their rows (a tensor, or ``None``); ``slot_of``: per row of the
    array its row in ``cache`` or -1 (``None`` without a cache); ``words``: what a reader reads the cache
    through (:class:`DiskRows`: the array's and its word views)."""

    hot: np.ndarray
    cache: Any
    slot_of: np.ndarray | None
    words: Any = None


NO_HOT_ROWS = HotRows(np.zeros(0, np.int64), None, None)


class RowReader:
    """What a feature store reads of a row reader (:class:`DiskRows`, :class:`~graphstore.storage.directrows.
    DirectRows`): ``len``, ``reader[ids]`` (integer IDs through ``gather``, anything else from
    ``np.asarray(reader)``), the RAM cache's size and the gather counts. A subclass sets ``shape``,
    ``row_bytes``, ``cache`` (a tensor of rows, or ``None``) and ``counts``, and defines ``gather`` and
    ``__array__``; its gathers read the cache through ``_hot`` (:class:`HotRows`)."""

    shape: tuple[int, ...]
    row_bytes: int
    counts: GatherCounts
    _hot: HotRows = NO_HOT_ROWS
    kind = ""  # as SharedReader names it
    where = ""
    unshared = False  # shared memory had no room for the cache (said once): sampler processes read without it

    def gather(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def tensor_dtype(self) -> torch.dtype:
        """The rows' dtype as torch names it (of the tensors :meth:`gather` fills)."""
        return _tensor_dtype(self.dtype)

    @property
    def hot(self) -> np.ndarray:
        """The row numbers the RAM cache holds (sorted)."""
        return self._hot.hot

    @property
    def cache(self) -> Any:
        """The RAM cache: a tensor of the :attr:`hot` rows, or ``None``."""
        return self._hot.cache

    @property
    def cached_rows(self) -> int:
        return 0 if self.cache is None else len(self.cache)

    @property
    def cache_bytes(self) -> int:
        return self.cached_rows * self.row_bytes

    def __getitem__(self, ids: Any) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            return np.asarray(self)[ids]
        return self.gather(ids.astype(np.int64, copy=False)).numpy()

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        """``rows`` gathered, ``hits`` (from the RAM cache), ``disk_bytes`` read from storage and
        ``read_seconds`` spent gathering, since the last reset."""
        return self.counts.snapshot(reset)

    def keep_hot(self, hot: np.ndarray | None, shared: bool = False) -> None:
        """Serve rows ``hot`` (row numbers) from RAM from now on, in place of the rows kept before (none:
        no RAM cache): read like a batch's rows, not counted as one; with ``shared``, into shared memory (the
        rank's sampler processes then read the same cache: :meth:`shared`). The rows kept before are let go
        first, so the two caches are never held at once; gathers meanwhile read from disk."""
        hot = np.unique(np.asarray(hot if hot is not None else (), np.int64))
        self._set_cache(np.zeros(0, np.int64), None)
        if len(hot):
            out = self._shared_rows(len(hot)) if shared else None
            with self.counts.muted():
                self._set_cache(hot, self._read_hot(hot, out))

    def _shared_rows(self, rows: int) -> torch.Tensor | None:
        """An uninitialised tensor of ``rows`` rows in shared memory, or ``None`` (said in one line) where the
        shared memory (``/dev/shm``) has no room for it: the cache is then this process's alone."""
        if self.unshared:  # said once already
            return None
        try:
            return _shared_empty((rows, *self.shape[1:]), self.dtype)
        except RuntimeError as exc:  # torch: "unable to allocate shared memory(shm) ...: No space left on device"
            self.unshared = True
            logger.warning("features: no room in shared memory (/dev/shm) for the %.2f GB RAM cache of %s (%s): the "
                           "sampler processes read its rows from disk; give /dev/shm more room (docker: "
                           "--shm-size) to share it", rows * self.row_bytes / 1e9, self.where, exc)
            return None

    def _read_hot(self, hot: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        """Rows ``hot`` (sorted, unique) read into ``out`` (a tensor of their shape; ``None``: a new one)."""
        raise NotImplementedError

    def _set_cache(self, hot: np.ndarray, cache: torch.Tensor | None) -> None:
        """Serve rows ``hot`` from ``cache`` (their rows, in order; ``None``: no cache), in one assignment."""
        if cache is None:
            self._hot = HotRows(hot, None, None)
            return
        slot_of = np.full(self.shape[0], -1, np.int32)
        slot_of[hot] = np.arange(len(hot), dtype=np.int32)
        self._hot = HotRows(hot, cache, slot_of, self._words_of(cache))

    def _words_of(self, cache: torch.Tensor) -> Any:
        """What this reader's gathers read ``cache`` through (:attr:`HotRows.words`)."""
        return None

    def shared(self) -> SharedReader:
        """What another process of this rank (its sampler processes) needs to read this array as this reader
        does, with the same RAM cache: the cache is moved into shared memory first where it is not there yet
        (once; :meth:`keep_hot` with ``shared`` puts it there at once; without room there, none is shared, said
        in one line). The move lets the private rows go and reads them again into shared memory, so the rank
        never holds the cache twice; its gathers meanwhile read those rows from disk. Pickled through
        ``torch.multiprocessing``, the cache travels as a handle to that memory, not as its rows."""
        state = self._hot
        if state.cache is not None and not state.cache.is_shared() and not self.unshared:
            hot, state = state.hot, None  # (no reference to the private rows left here)
            self.keep_hot(hot, shared=True)  # lets them go, then reads them again: into shared memory if it has room
        state = self._hot
        if state.cache is None or not state.cache.is_shared():  # no room there (said once): no cache for them
            return SharedReader(self.kind, np.zeros(0, np.int64), None, self.where)
        return SharedReader(self.kind, state.hot, state.cache, self.where)

    def adopt(self, shared: SharedReader) -> None:
        """Serve the hot rows of ``shared`` (another process's reader of the same array) from its cache."""
        if shared.cache is not None:
            self._set_cache(np.asarray(shared.hot, np.int64), shared.cache)


class DiskRows(RowReader):
    """``rows`` (a mapped 2-D+ array) read as a batch needs them: ``hot`` rows (local row numbers)
    copied once into RAM and served from there, the others read from disk by coalesced, parallel
    reads. Indexing with an integer array (``disk_rows[ids]``) returns the same values as ``rows[ids]``.

    Examples
    --------
    >>> rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    >>> d = DiskRows(rows, hot=np.array([2, 7]))
    >>> bool((d[np.array([7, 1, 2])] == rows[[7, 1, 2]]).all()), d.snapshot()["hits"]
    (True, 2)
    """

    kind = "mapped"

    def __init__(self, rows: np.ndarray, hot: np.ndarray | None = None, where: str = "") -> None:
        self.rows, self.where = rows, where
        self.shape, self.dtype = rows.shape, rows.dtype
        self.row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        self._rows_t = _as_tensor(rows)
        self._madvise = _madvise() if _is_page_aligned(rows) else None
        self.counts = GatherCounts()
        if self._madvise is not None and rows.nbytes:
            self._madvise(rows.ctypes.data, rows.nbytes, _MADV_RANDOM)  # a fault reads its page, no neighbours
        self.keep_hot(hot)

    def _read_hot(self, hot: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        return self._read(hot, out)

    def _words_of(self, cache: torch.Tensor) -> Any:
        return _word_view(np.asarray(self.rows)), _word_view(cache.numpy())  # the rows', the cache's

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.rows, dtype)

    def gather(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (local row numbers, in range) as a tensor, in order (into ``out`` when given: a
        contiguous tensor of their shape)."""
        import torch

        since = self.counts.start()
        state = self._hot  # read once: the cache may be replaced meanwhile
        if state.slot_of is None or not len(ids):
            out, hits = self._read(ids, out), 0
        else:
            slots = state.slot_of[ids]
            hit = slots >= 0
            hits = int(hit.sum())
            if hits < len(ids):
                self._prefetch(ids[~hit])
            if out is None:
                out = torch.empty((len(ids), *self.shape[1:]), dtype=self._rows_t.dtype)
            _copy_rows(*state.words, slots, ids, _word_view(out.numpy()))
        self.counts.add(len(ids), hits, since)
        return out

    def _read(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` from the mapping (into ``out`` when given): their pages asked for together, then copied."""
        import torch

        self._prefetch(ids)
        if out is None:
            return self._rows_t.index_select(0, torch.from_numpy(ids))
        return torch.index_select(self._rows_t, 0, torch.from_numpy(ids), out=out)

    def _prefetch(self, ids: np.ndarray) -> None:
        """Ask the kernel for the pages of rows ``ids`` at once: sorted, neighbours coalesced."""
        if self._madvise is not None and len(ids) > 1:
            first, last = page_ranges(np.unique(ids), self.row_bytes)
            base, page = self.rows.ctypes.data, mmap.PAGESIZE
            advise = self._madvise
            for a, b in zip((first * page).tolist(), ((last - first + 1) * page).tolist()):
                advise(base + a, b, _MADV_WILLNEED)



def _word_view(a: np.ndarray) -> np.ndarray:
    """``a`` as ``[rows, words]`` of the widest word dividing a row (a contiguous array)."""
    row_bytes = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    word = next(w for w in (np.uint64, np.uint32, np.uint16, np.uint8) if row_bytes % np.dtype(w).itemsize == 0)
    return np.ascontiguousarray(a).reshape(len(a), -1).view(word)


@njit(cache=True, nogil=True)
def _copy_rows(rows, cache, slots, ids, out):  # pragma: no cover - compiled
    """``out[i]`` = ``cache[slots[i]]`` when ``slots[i] >= 0``, else ``rows[ids[i]]``: one pass, no temporaries."""
    for i in range(len(ids)):
        if slots[i] >= 0:
            out[i, :] = cache[slots[i], :]
        else:
            out[i, :] = rows[ids[i], :]


def _tensor_dtype(dtype: Any) -> torch.dtype:
    import torch

    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _shared_empty(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
    """A tensor in shared memory, its values unset. ``share_memory_`` copies the tensor into a new segment, so
    every page of it is written (and charged) here, not as it is filled."""
    import torch

    return torch.empty(shape, dtype=_tensor_dtype(dtype)).share_memory_()


def _as_tensor(rows: np.ndarray) -> torch.Tensor:
    import warnings

    import torch

    with warnings.catch_warnings():  # read-only mappings: torch warns, and we never write through it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(rows))


def _is_page_aligned(rows: np.ndarray) -> bool:
    return os.name == "posix" and isinstance(rows, np.ndarray) and rows.ctypes.data % mmap.PAGESIZE == 0 \
        and rows.flags.c_contiguous


COLD_MIN_BYTES = 64 << 20  # arrays smaller than this fault their pages in quickly enough: no cold-start reads
COLD_SHARE = 64  # a gather that read more than 1/COLD_SHARE of its bytes from disk found the page cache cold
WARM_AFTER = 3  # gathers in a row that read (almost) nothing: the page cache holds the rows, stop asking ahead


class ColdStart:
    """A mapped array's gathers while its pages are not in the page cache (a fresh machine, or the cache
    turned over): each gather's pages asked for at once first (``madvise(MADV_WILLNEED)`` over the sorted
    rows, neighbours coalesced: many reads in flight) instead of one page fault after another at queue depth
    1. Whether the cache is cold is read from what each gather caused to be read from disk
    (``/proc/thread-self/io``): asking ahead stops after :data:`WARM_AFTER` gathers that read almost nothing
    and starts again at the first that faults its rows in. Warm, a gather costs two reads of that file more.
    """

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        self.cold, self.quiet = True, 0  # unknown at first: ask ahead until the gathers show the pages are there

    @staticmethod
    def applies(rows: Any) -> bool:
        """Whether ``rows`` is a mapped array worth it: large, page-aligned, on Linux (``madvise`` and the
        per-thread I/O counts)."""
        return (isinstance(rows, np.ndarray) and rows.nbytes >= COLD_MIN_BYTES and _is_page_aligned(rows)
                and os.path.exists("/proc/thread-self/io"))

    def index_select(self, rows_t: torch.Tensor, local: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``torch.index_select(rows_t, 0, local, out=out)`` (``rows_t`` this array's tensor), its pages asked
        for first while the cache is cold."""
        import torch

        before = thread_read_bytes()
        if self.cold and len(local) > 1:
            ids = np.unique(local.numpy())
            ids = ids[(ids >= 0) & (ids < len(self.rows))]  # others are refused by the select (halo rows)
            first, last = page_ranges(ids, self.row_bytes)
            will_need(self.rows.ctypes.data, first, last, mmap.PAGESIZE)
        got = torch.index_select(rows_t, 0, local, out=out)
        after = thread_read_bytes()
        if before is not None and after is not None:
            if (after - before) * COLD_SHARE > len(local) * self.row_bytes:
                self.cold, self.quiet = True, 0
            else:
                self.quiet += 1
                if self.quiet >= WARM_AFTER:
                    self.cold = False
        return got


@intrinsic
def _madvise_call(typingctx, addr, length, advice):
    """``madvise((void *) addr, length, advice)``, named (not addressed) so the kernel calling it caches."""
    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [ptr, i64, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "madvise")
        return builder.call(fn, [builder.inttoptr(args[0], ptr), args[1], builder.trunc(args[2], i32)])

    return types.int32(types.int64, types.int64, types.int64), codegen


@njit(cache=True, nogil=True)
def will_need(base, first, last, page):  # pragma: no cover - compiled
    """``MADV_WILLNEED`` over the pages ``[first[i], last[i]]`` of the mapping at ``base``."""
    for i in range(len(first)):
        _madvise_call(np.int64(base) + first[i] * page, (last[i] - first[i] + 1) * page, np.int64(_MADV_WILLNEED))
