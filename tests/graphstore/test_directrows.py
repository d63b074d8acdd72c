"""DirectRows: the rows the mapped array holds, read with O_DIRECT (past the page cache), hot rows from RAM,
several threads; where direct I/O is refused, the feature reader keeps the page-cache path and says so."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import pickle
import sys
import weakref

import numpy as np
import pytest

from graphstore.storage import directrows, uring
from graphstore.storage.directrows import ALIGN, direct_rows
from graphstore.storage.fileio import ChunkFiles

_TMPFS_MAGIC = 0x01021994


def _chunked(tmp_path, rows: np.ndarray, chunk_rows: int, absent: int | None = None) -> ChunkFiles:
    paths = []
    for c, first in enumerate(range(0, len(rows), chunk_rows)):
        if c == absent:
            paths.append(None)
            continue
        path = tmp_path / f"c{c}"
        rows[first:first + chunk_rows].tofile(path)
        paths.append(str(path))
    return ChunkFiles(paths, rows.shape, rows.dtype, chunk_rows, "x")


@pytest.mark.parametrize("row_len", [7, 1024, 3001])  # rows within a block, one block, straddling blocks
@pytest.mark.parametrize("threads, ring", [(1, 0), (4, 0), (1, 8)])  # a thread, a pool, an io_uring
def test_rows_equal_the_stored_ones_in_any_order_with_repeats_and_an_absent_chunk(tmp_path, row_len, threads, ring):
    rows = np.random.default_rng(row_len).standard_normal((4001, row_len)).astype(np.float32)
    files = _chunked(tmp_path, rows, 700, absent=2)
    rows[1400:2100] = 0  # an absent chunk reads as zeros
    hot = np.array([3, 1500, 4000])
    reader = direct_rows(files, rows, hot=hot, threads=threads, ring=ring)
    assert reader is not None and reader.cached_rows == 3 and reader.snapshot()["rows"] == 0
    assert reader.ring == ring or uring.open_ring(8, 1 << 16) is None  # the ring when the kernel offers one
    ids = np.random.default_rng(1).integers(0, len(rows), 2500)
    ids[:5] = ids[5]  # repeats
    ids[6], ids[7] = 0, len(rows) - 1  # the first row, and the last one at the end of a short last chunk
    assert np.array_equal(reader[ids], rows[ids])
    assert reader[np.zeros(0, np.int64)].shape == (0, row_len)
    snap = reader.snapshot(reset=True)
    assert snap["rows"] == 2500 and snap["hits"] == int(np.isin(ids, hot).sum())
    read = np.unique(ids[~np.isin(ids, hot) & ((ids < 1400) | (ids >= 2100))])  # rows on disk, not cached
    assert snap["disk_bytes"] >= len(read) * rows.itemsize * row_len  # each read covers its rows whole
    assert np.array_equal(np.asarray(reader), rows)


def _resident_pages(path) -> int:
    """Pages of the file ``path`` in the page cache (``mincore`` over a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
    try:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(mapped, np.uint8)
        addr = view.ctypes.data
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, os.strerror(ctypes.get_errno())
        del view
        return sum(v & 1 for v in vec)
    finally:
        mapped.close()


def _on_tmpfs(path) -> bool:
    """Whether ``path`` lies on tmpfs (the longest mount point above it, from /proc/self/mountinfo)."""
    best, kind = "", ""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point, fstype = fields[4], fields[fields.index("-") + 1]
            if str(path).startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, kind = point, fstype
    return kind == "tmpfs"


@pytest.mark.parametrize("threads, ring", [(4, 0), (1, 8)])
def test_a_truncated_chunk_is_named_not_read_as_garbage(tmp_path, threads, ring):
    from graphstore.errors import CorruptDatasetError

    rows = np.random.default_rng(4).standard_normal((3000, 1024)).astype(np.float32)
    files = _chunked(tmp_path, rows, 1000)
    os.truncate(files.paths[1], 500 * 4096)  # chunk 1 holds half its rows
    reader = direct_rows(files, rows, threads=threads, ring=ring)
    ids = np.arange(0, 3000, 7)
    assert np.array_equal(reader[ids[ids < 1500]], rows[ids[ids < 1500]])  # what is there reads
    with pytest.raises(CorruptDatasetError, match="came back short.*graphstore verify"):
        reader[ids]
    # the reads in flight at the short one were reaped: the same ring reads the next batch right
    assert np.array_equal(reader[ids[ids < 1500][::-1]], rows[ids[ids < 1500][::-1]])


def test_rows_read_directly_leave_nothing_in_the_page_cache(tmp_path):
    if _on_tmpfs(tmp_path):
        pytest.skip("the temporary folder is on tmpfs, where every page is resident whatever the reads do")
    rows = np.random.default_rng(2).standard_normal((20000, 256)).astype(np.float32)  # 1 KiB rows, 20 MB
    files = _chunked(tmp_path, rows, 20000)
    fd = os.open(files.paths[0], os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    before = _resident_pages(files.paths[0])
    reader = direct_rows(files, rows, threads=4)
    ids = np.random.default_rng(3).integers(0, len(rows), 8000)  # about a third of the rows
    assert np.array_equal(reader[ids], rows[ids])
    assert reader.snapshot()["disk_bytes"] >= 1000 * ALIGN
    assert _resident_pages(files.paths[0]) - before < 16, "rows read with O_DIRECT went through the page cache"


def test_where_direct_io_is_refused_the_feature_reader_says_so_and_reads_through_the_page_cache(
        tmp_path, monkeypatch, caplog):
    import graphstore
    from graphstore.storage.diskrows import DiskRows
    from training.loop.featurecache import FeatureReader

    real_open = os.open

    def refusing(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    graphstore.ingest("synthetic:nodes=2000,avg_degree=4,features=16,seed=1", tmp_path / "d", num_parts=1)
    ds = graphstore.open_dataset(tmp_path / "d")
    monkeypatch.setattr(directrows.os, "open", refusing)
    with caplog.at_level(logging.WARNING, logger="graphstore"):
        reader = FeatureReader.install(ds, [0], 0, 1)
    assert isinstance(reader.readers[0], DiskRows)
    said = [r.getMessage() for r in caplog.records if "direct I/O" in r.getMessage()]
    assert len(said) == 1 and "refuses direct I/O (O_DIRECT)" in said[0] and "page cache" in said[0]
    monkeypatch.undo()
    ds2 = graphstore.open_dataset(tmp_path / "d")
    assert type(FeatureReader.install(ds2, [0], 0, 1).readers[0]).__name__ == "DirectRows"


@pytest.mark.parametrize("ring", [0, 8])  # pread from a thread, the io_uring
def test_rows_of_whole_blocks_next_to_each_other_are_read_into_the_batch_not_through_a_buffer(tmp_path, ring):
    """The reads land in the batch's (aligned) rows themselves: the thread's buffer or the ring's slots are
    never written, yet the rows are right; rows that are not next to each other in the batch go through it."""
    rows = np.random.default_rng(6).standard_normal((3000, 1024)).astype(np.float32)  # 4 KiB rows
    files = _chunked(tmp_path, rows, 1000)
    reader = direct_rows(files, rows, threads=1, ring=ring)
    if ring and reader.ring == 0:
        pytest.skip("no io_uring on this kernel")
    fds, row_bytes = reader.fds, reader.row_bytes
    ids = np.r_[np.arange(10, 40), np.arange(990, 1010), [1500, 1600, 2999]]  # runs, one across chunks, lone rows
    for order, through_buffer in ((np.arange(len(ids)), False), (np.r_[1, 0, np.arange(2, len(ids))], True)):
        out = directrows._batch_buffer(len(ids) * row_bytes, row_bytes)
        assert out.ctypes.data % ALIGN == 0
        args = directrows._ring_of(reader).args() if ring else ()
        scratch = args[4] if ring else reader._buffer()  # the ring's slots, or the thread's buffer
        scratch[:] = 0xAB
        got = (uring.read_sorted(*args, fds, files.chunk_rows, row_bytes, ids, order, out, ALIGN) if ring else
               directrows._read_sorted(fds, files.chunk_rows, row_bytes, ids, order, out, scratch))
        assert got >= len(ids) * row_bytes
        assert np.array_equal(out.view(np.float32).reshape(len(ids), -1)[order], rows[ids])
        assert bool((scratch != 0xAB).any()) == through_buffer


@pytest.mark.parametrize("direct", [True, False])  # DirectRows, and the page-cache DiskRows
def test_hot_rows_kept_later_replace_the_cache_and_count_as_no_batch(tmp_path, direct):
    from graphstore.storage.diskrows import DiskRows

    rows = np.random.default_rng(4).standard_normal((3000, 256)).astype(np.float32)
    reader = direct_rows(_chunked(tmp_path, rows, 1000), rows, threads=1, ring=0) if direct else DiskRows(rows)
    ids = np.random.default_rng(5).integers(0, len(rows), 900)
    assert np.array_equal(reader[ids], rows[ids]) and reader.cached_rows == 0
    reader.keep_hot(np.array([7, 7, 2999, 12]))  # a repeat: kept once
    assert reader.cached_rows == 3 and reader.cache_bytes == 3 * 1024
    assert reader.snapshot()["rows"] == 900  # the fill is not a batch's gather: the counts go on
    assert np.array_equal(reader[ids], rows[ids])
    snap = reader.snapshot(reset=True)
    assert snap["rows"] == 1800 and snap["hits"] == int(np.isin(ids, [7, 12, 2999]).sum())
    reader.keep_hot(np.arange(100, 400))  # another set in its place
    assert reader.cached_rows == 300 and np.array_equal(reader[ids], rows[ids])
    assert reader.snapshot(reset=True)["hits"] == int(((ids >= 100) & (ids < 400)).sum())
    reader.keep_hot(None)  # none
    assert reader.cached_rows == 0 and np.array_equal(reader[ids], rows[ids]) and reader.snapshot()["hits"] == 0


@pytest.mark.parametrize("direct", [True, False])  # DirectRows, and the page-cache DiskRows
def test_a_reader_rebuilt_from_its_shared_form_serves_its_hot_rows_from_the_same_memory(tmp_path, direct):
    """What a rank hands its sampler processes: the reader's kind, hot rows and cache, the cache pickled as a
    handle to shared memory (not its rows); rebuilt, it reads what the array holds and its hits come from the
    rank's cache itself (a row changed there is what the rebuilt reader returns). A private cache moves there
    without being held twice: let go, then read again."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (its reductions: tensors pickle as handles to shared memory)

    from graphstore.storage.diskrows import DiskRows
    from graphstore.storage.directrows import reopen

    rows = np.random.default_rng(6).standard_normal((3000, 256)).astype(np.float32)
    files = _chunked(tmp_path, rows, 1000)
    reader = direct_rows(files, rows, threads=1, ring=0) if direct else DiskRows(rows)
    reader.keep_hot(np.arange(0, 3000, 10), shared=True)
    assert reader.cache.is_shared() and reader.cached_rows == 300
    blob = ForkingPickler.dumps(reader.shared())
    assert len(blob) < 10_000 < reader.cache_bytes  # a handle, not 300 rows of 1 KB
    again = reopen(pickle.loads(blob), files, rows)
    assert type(again) is type(reader) and again.kind == ("direct" if direct else "mapped")
    ids = np.random.default_rng(7).integers(0, len(rows), 900)
    assert np.array_equal(again[ids], rows[ids])
    assert again.snapshot()["hits"] == int((ids % 10 == 0).sum()) and reader.snapshot()["rows"] == 0
    reader.cache[0] = -1.0  # row 0, in the rank's cache: the rebuilt reader serves that memory
    assert bool((again[np.array([0])] == -1.0).all()) and np.array_equal(again[np.array([1])], rows[[1]])
    private = direct_rows(files, rows, threads=1, ring=0) if direct else DiskRows(rows)
    private.keep_hot(np.array([5, 9]))  # kept in private memory: moved to shared memory when shared
    before, read_hot, shared_rows, alive = weakref.ref(private.cache), private._read_hot, private._shared_rows, []

    def making(rows):  # the shared memory made (torch writes every page of it then), and the rows read into it:
        alive.append(before() is not None)  # the private copy is gone by then
        return shared_rows(rows)

    def reading_again(hot, out):
        alive.append(before() is not None)
        return read_hot(hot, out)

    private._shared_rows, private._read_hot = making, reading_again
    was_shared = private.cache.is_shared()  # (not inside an assert: pytest would keep the tensor for its message)
    assert not was_shared and private.shared().cache.is_shared()
    assert alive == [False, False] and private.snapshot()["rows"] == 0  # never two copies; the move is no gather
    assert np.array_equal(private[np.array([9, 5, 4])], rows[[9, 5, 4]]) and private.snapshot()["hits"] == 2


def test_without_room_in_shared_memory_the_cache_stays_private_and_the_processes_read_without_it(tmp_path, monkeypatch,
                                                                                                   caplog):
    """/dev/shm too small for the cache (a container's 64 MB): one line says so and how to give it room; the rank
    keeps its cache, the rebuilt reader reads every row from disk, and both still return the stored rows."""
    from graphstore.storage import diskrows
    from graphstore.storage.directrows import reopen

    def full(shape, dtype):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)")

    monkeypatch.setattr(diskrows, "_shared_empty", full)
    rows = np.random.default_rng(8).standard_normal((2000, 64)).astype(np.float32)
    files = _chunked(tmp_path, rows, 500)
    reader = direct_rows(files, rows, threads=1, ring=0)
    with caplog.at_level(logging.WARNING, logger="graphstore"):
        reader.keep_hot(np.arange(0, 2000, 4), shared=True)
        shared = reader.shared()  # tried once: not again
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no room in shared memory (/dev/shm)" in said[0] and "--shm-size" in said[0]
    assert reader.cached_rows == 500 and not reader.cache.is_shared() and shared.cache is None
    kept = reader.cache
    assert reader.shared().cache is None and reader.cache is kept  # asked again: its rows are not read again
    again = reopen(shared, files, rows)
    ids = np.random.default_rng(9).integers(0, 2000, 300)
    assert np.array_equal(again[ids], rows[ids]) and again.snapshot()["hits"] == 0
    assert np.array_equal(reader[ids], rows[ids]) and reader.snapshot()["hits"] == int((ids % 4 == 0).sum())


@pytest.mark.parametrize("direct", [True, False])  # DirectRows, and the page-cache DiskRows
def test_gathers_beside_a_cache_being_replaced_return_the_stored_rows(tmp_path, direct):
    """A rank's loader threads gather while its cache is filled again or moved to shared memory (a loader of
    sampler processes starting): each gather reads one cache whole, its slots with its rows, never one
    cache's slots with another's rows."""
    import threading

    from graphstore.storage.diskrows import DiskRows

    rows = np.random.default_rng(11).standard_normal((4000, 64)).astype(np.float32)
    files = _chunked(tmp_path, rows, 1000)
    reader = (direct_rows(files, rows, threads=1, ring=0) or direct_rows(files, rows, threads=1, ring=0, direct=False)
              if direct else DiskRows(rows))
    wrong, done = [], threading.Event()

    def gather(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(400):  # bounded
            ids = rng.integers(0, len(rows), 256)
            try:
                if not np.array_equal(reader[ids], rows[ids]):
                    wrong.append(seed)
            except Exception as exc:  # e.g. one cache's slots, and the next one not there yet
                wrong.append(repr(exc))
            if done.is_set():
                return

    threads = [threading.Thread(target=gather, args=(s,)) for s in (1, 2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between nearly any two bytecodes: the interleavings show
    try:
        for t in threads:
            t.start()
        rng = np.random.default_rng(3)
        for i in range(60):  # other hot sets each time: slots and rows differ between caches
            reader.keep_hot(rng.choice(len(rows), 600, replace=False))
            if i % 3 == 0:
                reader.shared()
        done.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads) and wrong == []
    assert reader.snapshot()["rows"] > 0  # the gathers ran, and were counted; the fills were not
