"""DiskRows: the same rows as the mapped array, hot rows from RAM, misses read from disk and counted."""

from __future__ import annotations

import os

import numpy as np
import pytest

from graphstore.storage.diskrows import DiskRows, page_ranges, thread_read_bytes


def _evict(path) -> None:
    """Drop ``path``'s pages from the page cache (those no mapping holds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def mapped(tmp_path):
    rows = np.random.default_rng(0).standard_normal((5000, 256)).astype(np.float32)  # 1 KiB a row
    path = tmp_path / "x.bin"
    rows.tofile(path)
    return path, rows, np.memmap(path, dtype=np.float32, mode="r", shape=rows.shape)


@pytest.mark.parametrize("hot", [None, np.arange(0, 5000, 7)])
def test_rows_equal_the_mapped_arrays_in_any_order_with_repeats(mapped, hot):
    _, rows, mm = mapped
    disk = DiskRows(mm, hot=hot)
    ids = np.random.default_rng(1).integers(0, 5000, 3000)
    ids[:10] = ids[10]  # repeats
    assert np.array_equal(disk[ids], rows[ids])
    assert disk[np.zeros(0, np.int64)].shape == (0, 256)
    snap = disk.snapshot(reset=True)
    assert snap["rows"] == 3000
    assert snap["hits"] == (0 if hot is None else int(np.isin(ids, hot).sum()))
    assert disk.snapshot()["rows"] == 0
    assert np.array_equal(np.asarray(disk), rows)


def test_the_cache_holds_the_hot_rows_within_its_budget(mapped):
    _, rows, mm = mapped
    disk = DiskRows(mm, hot=np.array([4, 4, 9, 4999]))
    assert disk.cached_rows == 3 and disk.cache_bytes == 3 * 1024
    assert disk.snapshot()["rows"] == 0  # filling the cache is no batch's
    assert np.array_equal(disk[np.array([4999, 9, 4])], rows[[4999, 9, 4]])
    assert disk.snapshot()["hits"] == 3


def test_page_ranges_merge_neighbours_and_cover_every_row():
    first, last = page_ranges(np.array([0, 3, 4, 100, 101, 400]), 1024, gap=0)  # four rows a page
    assert first.tolist() == [0, 25, 100] and last.tolist() == [1, 25, 100]
    first, last = page_ranges(np.array([1, 2]), 6000)  # rows across page boundaries
    assert first.tolist() == [1] and last.tolist() == [4]


@pytest.mark.skipif(thread_read_bytes() is None, reason="no /proc/thread-self/io on this system")
def test_rows_not_in_the_page_cache_are_read_from_disk_and_counted(mapped):
    path, rows, mm = mapped
    _evict(path)
    disk = DiskRows(mm)
    ids = np.arange(0, 5000, 40)
    assert np.array_equal(disk[ids], rows[ids])
    got = disk.snapshot()["disk_bytes"]
    if got == 0:
        pytest.skip("this file system does not account reads per thread (e.g. tmpfs)")
    assert got >= len(ids) * 1024


def test_cold_start_asks_ahead_while_gathers_read_from_disk_and_stops_once_the_cache_holds_them(mapped, monkeypatch):
    import warnings

    import torch

    from graphstore.storage import diskrows
    from graphstore.storage.diskrows import WARM_AFTER, ColdStart

    path, rows, _ = mapped
    _evict(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=rows.shape)
    assert not ColdStart.applies(mm)  # 5 MB: faulting it in is quick enough
    monkeypatch.setattr(diskrows, "COLD_MIN_BYTES", 0)
    assert ColdStart.applies(mm) and not ColdStart.applies(rows[1:])  # a copy, not page-aligned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rows_t = torch.from_numpy(np.asarray(mm))
    cold = ColdStart(mm)

    def select(ids: np.ndarray) -> torch.Tensor:
        return cold.index_select(rows_t, torch.from_numpy(ids), torch.empty(len(ids), 256))

    ids = np.arange(0, 5000, 40)  # a row every 10th page
    read0 = thread_read_bytes()
    assert torch.equal(select(ids), torch.from_numpy(rows[ids]))
    if thread_read_bytes() == read0:
        pytest.skip("this file system does not account reads per thread (e.g. tmpfs)")
    assert cold.cold  # the gather read its rows from disk
    for _ in range(WARM_AFTER):
        assert torch.equal(select(ids[::-1].copy()), torch.from_numpy(rows[ids[::-1]]))
    assert not cold.cold  # the page cache holds them: no more asking ahead
    other = ids + 20  # pages 5, 15, ...: never read
    assert torch.equal(select(other), torch.from_numpy(rows[other])) and cold.cold
