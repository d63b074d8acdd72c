"""The remote read path without S3: lazy chunk fetches, concurrency, the shared cache, faults, eviction."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
from graphstore.dataset import layout
from graphstore.storage.cache import CacheConfig, evict, parse_size
from graphstore.errors import ConfigError, CorruptDatasetError, RowIndexError
from graphstore.storage.lazy import LazyRows
from graphstore.storage.local import LocationWrapper, open_location
from tests.conftest import assert_roundtrip, small_graph, small_hetero

X = "part_00000/nodes/_N/x"


class Counting(LocationWrapper):
    """Records every download (key), the downloads in flight, and optionally waits on a barrier."""

    def __init__(self, inner, barrier: threading.Barrier | None = None) -> None:
        super().__init__(inner)
        self.keys: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self.barrier = barrier
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"inner": self.inner}

    def __setstate__(self, state):
        self.__init__(state["inner"])

    def download(self, key, dest, on_retry=None):
        with self._lock:
            self.keys.append(key)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=30)  # proves `parties` downloads are in flight at once
            return super().download(key, dest, on_retry)
        finally:
            with self._lock:
                self.in_flight -= 1


class FailMidWrite(LocationWrapper):
    """Writes half of the chunks whose key contains ``part`` and then fails, like a dropped connection."""

    def __init__(self, inner, part: str) -> None:
        super().__init__(inner)
        self.part = part

    def download(self, key, dest, on_retry=None):
        size = super().download(key, dest, on_retry)
        if self.part in key:
            with open(dest, "r+b") as fh:
                fh.truncate(size // 2)
            raise ConnectionResetError("connection reset by peer (injected)")
        return size


class HangMidWrite(LocationWrapper):
    """Writes half of a chunk, drops a marker file, and hangs (until the test kills the process)."""

    def __init__(self, inner, marker: str) -> None:
        super().__init__(inner)
        self.marker = marker

    def download(self, key, dest, on_retry=None):
        data = self.inner.read_bytes(key)
        with open(dest, "wb") as fh:
            fh.write(data[: len(data) // 2])
        Path(self.marker).write_text(dest)
        time.sleep(120)
        raise AssertionError("should have been killed")


class Corrupting(LocationWrapper):
    """Flips a byte of the first ``times`` downloads."""

    def __init__(self, inner, times: int) -> None:
        super().__init__(inner)
        self.times, self.calls = times, 0

    def download(self, key, dest, on_retry=None):
        size = super().download(key, dest, on_retry)
        self.calls += 1
        if self.calls <= self.times:
            _flip(dest)
        return size


def _flip(path, offset: int = 7) -> None:
    raw = bytearray(Path(path).read_bytes())
    raw[offset] ^= 0xFF
    Path(path).write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    source, expected = small_graph(n=4000, e=16000, seed=3, features=64)
    dest = tmp_path_factory.mktemp("cache") / "ds"
    graphstore.ingest(source, dest, num_parts=2, method="range", chunk_mb=0.05)
    ds = graphstore.open_dataset(dest)
    assert ds.manifest.arrays[X].num_chunks >= 8  # x spans many chunks: the lazy path has work to do
    return ds, expected


def _remote(local_ds, tmp_path, wrapper=Counting, **kwargs):
    location = wrapper(open_location(local_ds.url), **kwargs)
    return graphstore.open_dataset(location, cache_dir=tmp_path / "cache"), location


def _cache_files(tmp_path, pattern="*"):
    return sorted(p for p in (tmp_path / "cache").rglob(pattern) if p.is_file() and not p.name.endswith(".lock"))


def test_local_datasets_stay_plain_mapped_arrays(local):
    ds, _ = local
    assert type(ds.array(X)) is np.ndarray
    ds.partition(0)[0][None, "x", torch.arange(10)]
    assert ds.io_stats()["requests"] == 0 and ds.prefetch(0) == 0


def test_a_gather_fetches_only_the_chunks_it_needs(local, tmp_path):
    ds_local, _ = local
    ds, loc = _remote(ds_local, tmp_path)
    rows = ds.array(X)
    assert isinstance(rows, LazyRows) and not rows.complete and loc.keys == []
    fs, gs = ds.partition(0)
    lo, _ = gs.dst_range()
    cr = ds.manifest.arrays[X].chunk_rows
    ids = torch.tensor([lo + 1, lo + 3 * cr + 5, lo + 2, lo + 3 * cr])  # chunks 0 and 3 only
    assert torch.equal(fs[None, "x", ids], ds_local.partition(0)[0][None, "x", ids])
    assert sorted(loc.keys) == [layout.chunk_key(X, 0, 2), layout.chunk_key(X, 3, 2)]
    stats = ds.io_stats()["arrays"][X]
    assert (stats["requests"], stats["misses"], stats["hits"]) == (2, 2, 0) and stats["bytes"] > 0
    fs[None, "x", ids]
    assert len(loc.keys) == 2  # a second read of the same rows asks for nothing
    whole = fs[None, "x", None]  # index=None ensures every chunk
    assert torch.equal(whole, ds_local.partition(0)[0][None, "x", None])
    assert len(loc.keys) == ds.manifest.arrays[X].num_chunks
    assert type(ds.array(X)) is np.ndarray  # complete: the wrapper is gone from the read path
    assert torch.equal(fs[None, "x", ids], ds_local.partition(0)[0][None, "x", ids])


def test_a_gather_fetches_its_chunks_concurrently(local, tmp_path):
    ds_local, _ = local
    location = Counting(open_location(ds_local.url), barrier=threading.Barrier(4))
    ds = graphstore.open_dataset(location, cache_dir=tmp_path / "cache", concurrency=4)
    cr = ds.manifest.arrays[X].chunk_rows
    rows = np.arange(8) * cr  # 8 uncached chunks
    got = ds.array(X)[rows]
    assert np.array_equal(got, np.asarray(ds_local.array(X))[rows])
    assert len(location.keys) == 8 and location.max_in_flight == 4  # two rounds of 4: ceil(K / concurrency)


def test_the_cache_serves_a_second_pass_and_a_new_process(local, tmp_path):
    ds_local, expected = local
    ds, loc = _remote(ds_local, tmp_path)
    assert_roundtrip(ds, expected)
    first = ds.io_stats()
    assert first["misses"] == len(loc.keys) and first["hits"] == 0
    assert_roundtrip(ds, expected)
    assert ds.io_stats()["requests"] == first["requests"]  # the second pass: zero new requests
    again = pickle.loads(pickle.dumps(ds))  # what a DataLoader worker or another process gets
    assert again.io_stats()["requests"] == 0
    assert_roundtrip(again, expected)
    stats = again.io_stats()
    assert stats["requests"] == 0 and stats["misses"] == 0 and stats["hits"] == first["misses"]
    ds.reset_io_stats()
    assert ds.io_stats()["requests"] == 0 and ds.io_stats()["arrays"] == {}


def test_a_download_failing_mid_write_leaves_no_cache_entry(local, tmp_path):
    ds_local, _ = local
    chunk = layout.chunk_key(X, 1, 2)
    ds, _ = _remote(ds_local, tmp_path, FailMidWrite, part=chunk)
    cr = ds.manifest.arrays[X].chunk_rows
    with pytest.raises(ConnectionResetError):
        ds.array(X)[np.array([cr + 1])]
    assert _cache_files(tmp_path, "0") == [] and _cache_files(tmp_path, "*.tmp-*") == []
    good, loc = _remote(ds_local, tmp_path)
    assert np.array_equal(good.array(X)[np.array([cr + 1])], np.asarray(ds_local.array(X))[[cr + 1]])
    assert loc.keys == [chunk]


def _hang(location, cache_dir: str) -> None:
    ds = graphstore.open_dataset(location, cache_dir=cache_dir)
    ds.array(X)[np.array([0])]


def test_a_killed_download_leaves_no_corrupt_entry(local, tmp_path):
    ds_local, _ = local
    marker = tmp_path / "marker"
    location = HangMidWrite(open_location(ds_local.url), str(marker))
    child = multiprocessing.get_context("spawn").Process(target=_hang, args=(location, str(tmp_path / "cache")))
    child.start()
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and child.is_alive():
        time.sleep(0.05)
    assert marker.exists(), "the child never started its download"
    child.kill()
    child.join(30)
    half = Path(marker.read_text())
    assert half.exists() and ".tmp-" in half.name  # the torn download, under a temporary name only
    assert not half.with_name("0").exists()
    ds, loc = _remote(ds_local, tmp_path)
    assert np.array_equal(ds.array(X)[np.array([0])], np.asarray(ds_local.array(X))[[0]])
    assert loc.keys == [layout.chunk_key(X, 0, 2)] and not half.exists()  # re-fetched; leftovers cleared


def test_a_damaged_cached_chunk_is_fetched_again(local, tmp_path, caplog):
    ds_local, _ = local
    ds, _ = _remote(ds_local, tmp_path)
    expected = np.asarray(ds_local.array(X))
    np.asarray(ds.array(X))
    files = {p.parent.name: p for p in _cache_files(tmp_path, "0") if p.parent.parent.name == "c"
             and p.parent.parent.parent.name == "x" and "part_00000" in str(p)}
    _flip(files["2"])  # bit rot
    with open(files["4"], "r+b") as fh:  # a truncated file
        fh.truncate(100)
    fresh, loc = _remote(ds_local, tmp_path)
    with caplog.at_level(logging.WARNING, logger="graphstore.storage.cache"):
        assert np.array_equal(np.asarray(fresh.array(X)), expected)
    assert sorted(loc.keys) == [layout.chunk_key(X, 2, 2), layout.chunk_key(X, 4, 2)]
    assert "damaged" in caplog.text and "chunk 2" in caplog.text
    stats = fresh.io_stats()["arrays"][X]
    assert stats["misses"] == 2 and stats["hits"] == ds.manifest.arrays[X].num_chunks - 2


def test_a_damaged_download_is_fetched_once_more_then_refused(local, tmp_path):
    ds_local, _ = local
    ds, loc = _remote(ds_local, tmp_path, Corrupting, times=1)
    assert np.array_equal(ds.array(X)[np.array([0])], np.asarray(ds_local.array(X))[[0]])
    assert loc.calls == 2 and ds.io_stats()["arrays"][X]["requests"] == 2
    bad, _ = _remote(ds_local, tmp_path / "other", Corrupting, times=99)
    with pytest.raises(CorruptDatasetError, match=r"chunk 0 of array part_00000/nodes/_N/x .* checksum twice") as err:
        bad.array(X)[np.array([0])]
    assert ds_local.url in str(err.value)


def test_the_size_limit_evicts_least_recently_used(local, tmp_path):
    ds_local, _ = local
    chunk = os.path.getsize(ds_local.location.local_file(layout.chunk_key(X, 0, 2)))
    limit = 3 * chunk + 100
    location = Counting(open_location(ds_local.url))
    ds = graphstore.open_dataset(location, cache_dir=tmp_path / "cache", cache_max_bytes=limit,
                                 concurrency=1)  # one at a time: chunk i is used before chunk i + 1
    expected = np.asarray(ds_local.array(X))
    assert np.array_equal(np.asarray(ds.array(X)), expected)  # still whole: evicted files stay mapped
    assert sum(p.stat().st_size for p in _cache_files(tmp_path)) <= limit
    kept = {p.parent.name for p in _cache_files(tmp_path, "0") if "nodes/_N/x" in p.as_posix()}
    assert 0 < len(kept) <= 3 and str(ds.manifest.arrays[X].num_chunks - 1) in kept  # the newest stay
    again = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(np.asarray(again.array(X)), expected)
    assert again.io_stats()["arrays"][X]["misses"] >= ds.manifest.arrays[X].num_chunks - 3


def test_prefetch_pulls_a_partition_with_progress(local, tmp_path):
    ds_local, _ = local
    ds, loc = _remote(ds_local, tmp_path)
    seen = []
    fs, gs = ds.partition(1, prefetch=["x"], progress=lambda done, total: seen.append((done, total)))
    fetched = {k.rsplit("/c/", 1)[0] for k in loc.keys}
    assert fetched == {"part_00001/nodes/_N/x", "part_00001/edges/_N/indptr", "part_00001/edges/_N/indices",
                       "part_00001/edges/_N/eid", "part_00001/edges/_N/packed", "part_00001/halo/_N/ids"}
    assert seen[-1][0] == seen[-1][1] == len(loc.keys)
    before = len(loc.keys)
    fs[None, "x", None], gs.csc_arrays()
    assert len(loc.keys) == before  # everything the sampler and the feature gather need is local now
    ds.partition(1, prefetch=True)
    assert {k.split("/")[0] for k in loc.keys} == {"part_00001"}
    with pytest.raises(KeyError, match="prefetch names"):
        ds.partition(1, prefetch=["nope"])


def test_lazy_rows_index_like_numpy(local, tmp_path):
    ds_local, _ = local
    ds, _ = _remote(ds_local, tmp_path)
    rows, expected = ds.array(X), np.asarray(ds_local.array(X))
    n = len(rows)
    assert np.array_equal(rows[np.array([-1, 0, -n])], expected[[-1, 0, -n]])
    assert np.array_equal(rows[5], expected[5]) and np.array_equal(rows[n - 3: n - 1], expected[n - 3: n - 1])
    assert np.array_equal(rows[::-400], expected[::-400])
    with pytest.raises(IndexError):
        rows[np.array([n])]
    with pytest.raises(RowIndexError, match="out of bounds"):
        rows[np.array([-n - 1])]


def test_compressed_and_hetero_datasets_through_the_cache(tmp_path):
    source, expected = small_graph(n=900, e=5000, seed=4)
    graphstore.ingest(source, tmp_path / "z", num_parts=2, compression="zstd", chunk_mb=0.01)
    ds, _ = _remote(graphstore.open_dataset(tmp_path / "z"), tmp_path)
    assert_roundtrip(ds, expected)
    data, expected = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=2, chunk_mb=0.01)
    ds, _ = _remote(graphstore.open_dataset(tmp_path / "h"), tmp_path)
    assert_roundtrip(ds, expected)


def test_any_fsspec_url_reads_and_writes(tmp_path):
    source, expected = small_graph(n=700, e=3000, seed=5)
    url = f"memory://graphstore-test-{tmp_path.name}/ds"
    assert graphstore.ingest(source, url, num_parts=2, chunk_mb=0.01).dest == url
    ds = graphstore.open_dataset(url, cache_dir=tmp_path / "cache")
    assert_roundtrip(ds, expected)
    assert ds.verify() == [] and ds.io_stats()["misses"] > 0
    open_location(url).remove()


def test_cache_options_are_checked(monkeypatch, tmp_path):
    assert parse_size("2GiB", "x") == 2**30 * 2 and parse_size("1.5 MB", "x") == 1_500_000 and parse_size(7, "x") == 7
    with pytest.raises(ConfigError, match="is not a size"):
        parse_size("lots", "--cache-max-bytes")
    with pytest.raises(ConfigError, match="concurrency"):
        CacheConfig(concurrency=0)
    monkeypatch.setenv("GRAPHSTORE_CACHE_DIR", str(tmp_path / "env-cache"))
    monkeypatch.setenv("GRAPHSTORE_CACHE_MAX_BYTES", "10MB")
    config = CacheConfig()
    assert config.directory == str(tmp_path / "env-cache") and config.max_bytes == 10_000_000
    monkeypatch.delenv("GRAPHSTORE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert CacheConfig().directory == str(tmp_path / "xdg" / "graphstore")


def test_evict_keeps_the_newest_and_clears_dead_temporaries(tmp_path):
    for i, name in enumerate(["a", "b", "c", "d"]):
        path = tmp_path / name
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "d.lock").write_bytes(b"")
    (tmp_path / "d.tmp-999999999-abcd").write_bytes(b"x" * 500)  # a dead process's download
    assert evict(str(tmp_path), 2500) <= 2250
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "d", "d.lock"]
