"""Offline reopen: a cached S3 dataset opens, reads and trains with its store stopped; a read needing a chunk the
cache lacks is refused naming its array; a store that answers with an error never falls back to the cache."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import graphstore
from graphstore.cli.app import main
from graphstore.dataset import layout
from graphstore.errors import DatasetNotFoundError, StorageError, StorageNotFoundError, StoragePermissionError
from graphstore.storage.cache import url_dir
from graphstore.storage.cachefiles import LATEST, MANIFEST_COPY, evict
from graphstore.storage.offline import NOTED_ENV
from graphstore.storage.retry import RetryPolicy
from tests.conftest import small_graph
from tests.graphstore.conftest import fake_credentials, new_bucket, start_moto
from tests.training.conftest import metrics, run_train, synthetic_source

pytestmark = pytest.mark.s3

SERVED = "serving the dataset from the local cache"
TRAIN = ("--nproc", 1, "--epochs", 1, "--fanout", "5,5", "--batch-size", 64, "--hidden", 16)


@pytest.fixture
def stoppable(monkeypatch, tmp_path):
    """This test's own moto server (the test stops it), a bucket on it, and no fallback announced yet."""
    server, endpoint = start_moto()
    fake_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv(NOTED_ENV, "")  # restored afterwards: what this test's opens note stays here
    try:
        yield server, new_bucket(endpoint)
    finally:
        server.stop()


def _read_all(ds) -> dict[str, np.ndarray]:
    """Every stored array (features, labels, masks, topology) of every partition, copied out."""
    return {path: np.array(ds.array(path)) for path in sorted(ds.manifest.arrays)}


def _served_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and SERVED in r.getMessage()]


def _chunk_file(cache, url: str, path: str, index: int) -> str:
    """The cache file of chunk ``index`` of array ``path`` (its dataset's only version in ``cache``)."""
    top = os.path.join(cache, url_dir(url))
    (digest,) = [d for d in os.listdir(top) if d != LATEST]
    return os.path.join(top, digest, *layout.chunk_key(path, index, 2).split("/"))


@pytest.mark.slow
def test_a_fully_cached_dataset_reads_and_trains_with_the_store_stopped(stoppable, tmp_path, caplog, monkeypatch):
    server, s3 = stoppable
    monkeypatch.setenv("GRAPHSTORE_LOG_DIR", str(tmp_path / "logs"))  # a failed job's log: here, not in /tmp
    url, cache = s3.url("syn"), str(tmp_path / "cache")
    graphstore.ingest(synthetic_source(n=1000), url, num_parts=2, method="range", chunk_mb=0.005,
                      storage_options=s3.storage_options)
    online = _read_all(graphstore.open_dataset(url, s3.storage_options, cache_dir=cache))  # every chunk cached
    args = (*TRAIN, *s3.cli_options(), "--cache-dir", cache)
    before = run_train(url, *args, "--metrics-out", tmp_path / "online.json")
    assert before.returncode == 0, before.stderr
    server.stop()

    with caplog.at_level(logging.INFO, logger="graphstore"):
        ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # no retries, no traceback
    assert line.startswith(f"{url}: the store is unreachable (EndpointConnectionError); {SERVED} {cache} as of ")
    offline = _read_all(ds)
    assert offline.keys() == online.keys() and all(np.array_equal(offline[p], online[p]) for p in online)
    assert ds.io_stats()["requests"] == 0 and ds.io_stats()["misses"] == 0

    os.environ[NOTED_ENV] = ""  # as in a fresh shell: the launcher announces it, its ranks do not again
    after = run_train(url, *args, "--metrics-out", tmp_path / "offline.json")
    assert after.returncode == 0, after.stderr
    assert after.stderr.count(SERVED) == 1, after.stderr
    keys = ("loss", "train_acc", "val_acc", "test_acc")
    ran = [{k: metrics(tmp_path / f"{run}.json")["epochs"][-1][k] for k in keys} for run in ("online", "offline")]
    assert ran[0] == ran[1]


def test_a_chunk_missing_from_the_cache_is_refused_naming_its_array(stoppable, tmp_path, caplog):
    server, s3 = stoppable
    url, cache = s3.url("ds"), str(tmp_path / "cache")
    graphstore.ingest(small_graph(n=1000, e=4000, seed=7, features=32)[0], url, num_parts=2, chunk_mb=0.02,
                      storage_options=s3.storage_options)
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    online, x = _read_all(ds), "part_00001/nodes/_N/x"
    chunks, total = ds.manifest.arrays[x].num_chunks, sum(a.num_chunks for a in ds.manifest.arrays.values())
    assert chunks > 1
    server.stop()
    os.remove(_chunk_file(cache, url, x, 1))

    refused = (rf"^{url} is served offline, and 1 of {chunks} chunks of {x} are not in the cache {cache}; reconnect "
               rf"to {url} \(and, while it is reachable, fetch every chunk with `graphstore info {url} --prefetch all "
               rf"--cache-dir {cache}`\)$")
    for options in (s3.storage_options, {**s3.storage_options, "offline": True}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="graphstore"):
            ds = graphstore.open_dataset(url, options, cache_dir=cache)  # opens: what is cached can be read
        (line,) = [r.getMessage() for r in caplog.records if SERVED in r.getMessage()]
        assert line.endswith(f"; {total - 1} of {total} chunks are cached, and a read needing another is refused")
        for path in set(online) - {x}:
            assert np.array_equal(np.asarray(ds.array(path)), online[path])
        with pytest.raises(StorageError, match=refused):  # never zeros in its place
            np.asarray(ds.array(x))
        assert ds.io_stats()["requests"] == 0


@pytest.mark.slow
def test_a_changed_remote_dataset_is_never_mixed_with_the_cached_one(stoppable, tmp_path):
    server, s3 = stoppable
    url, cache = s3.url("ds"), str(tmp_path / "cache")
    graphstore.ingest(small_graph(n=600, e=2400, seed=1)[0], url, num_parts=2, storage_options=s3.storage_options)
    _read_all(graphstore.open_dataset(url, s3.storage_options, cache_dir=cache))  # version 1, all cached
    graphstore.ingest(small_graph(n=600, e=2400, seed=2)[0], url, num_parts=2, overwrite=True,
                      storage_options=s3.storage_options)
    v2 = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    x0, x1 = "part_00000/nodes/_N/x", "part_00001/nodes/_N/x"
    read = np.array(v2.array(x0))  # version 2: only this array read
    server.stop()
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    assert ds.manifest == v2.manifest and np.array_equal(np.asarray(ds.array(x0)), read)
    with pytest.raises(StorageError, match=f"chunks of {x1} are not in the cache"):  # not version 1's rows
        np.asarray(ds.array(x1))


def test_no_copy_and_offline_false_fail_as_before(stoppable, tmp_path):
    server, s3 = stoppable
    url, cache = s3.url("ds"), str(tmp_path / "cache")
    graphstore.ingest(small_graph(n=300, e=900)[0], url, storage_options=s3.storage_options)
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    _read_all(ds)
    server.stop()
    quick = {**s3.storage_options, "config_kwargs": {"retries": {"total_max_attempts": 1}}}
    with pytest.raises(StorageError, match=f"reading zarr.json: {url} failed .*EndpointConnectionError"):
        graphstore.open_dataset(url, {**quick, "offline": False}, cache_dir=cache, retry=RetryPolicy(attempts=1))
    with pytest.raises(DatasetNotFoundError, match=f"{url} was opened offline .* the cache {tmp_path}/empty holds "
                                                   "no copy of it"):
        graphstore.open_dataset(url, {**quick, "offline": True}, cache_dir=tmp_path / "empty")
    # served from the cache, the dataset sends no request, even for what needs the store
    offline = graphstore.open_dataset(url, quick, cache_dir=cache)
    with pytest.raises(StorageError, match=r"served from the local cache \(offline\): graphstore sends its store no"):
        offline.verify()


def test_a_store_that_answers_with_an_error_never_falls_back(s3, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(NOTED_ENV, "")
    url, cache = s3.url("ds"), str(tmp_path / "cache")
    graphstore.ingest(small_graph(n=300, e=900)[0], url, storage_options=s3.storage_options)
    _read_all(graphstore.open_dataset(url, s3.storage_options, cache_dir=cache))  # a complete copy in the cache
    import moto.settings

    with monkeypatch.context() as denied:
        denied.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks credentials now
        with pytest.raises(StoragePermissionError, match=f"access to {url} was denied"):
            graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    s3.fs().rm_file(f"{s3.bucket}/ds/{layout.ROOT_METADATA}")  # the dataset is gone from the store
    with pytest.raises(DatasetNotFoundError, match=f"no graphstore dataset at {url}"):
        graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    s3.fs().rm(s3.bucket, recursive=True)  # and so is its bucket
    with pytest.raises(StorageNotFoundError, match=f"{url}.* bucket .*does not exist"):
        graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    assert not _served_lines(caplog)


def test_the_offline_flag_on_the_cli(s3, tmp_path, capsys):
    url, cache = s3.url("cli"), ["--cache-dir", str(tmp_path / "cache")]
    graphstore.ingest(small_graph(n=300, e=900)[0], url, storage_options=s3.storage_options)
    assert main(["info", url, "--offline", *s3.cli_options(), *cache]) == 2
    assert "holds no copy of it" in capsys.readouterr().err
    assert main(["info", url, "--prefetch", "all", *s3.cli_options(), *cache]) == 0
    capsys.readouterr()
    assert main(["info", url, "--offline", "--io", *s3.cli_options(), *cache]) == 0  # the store is up: not asked
    assert "io: 0 requests" in capsys.readouterr().out


def test_eviction_keeps_what_an_offline_reopen_needs(tmp_path):
    version = tmp_path / "ds-0123456789abcdef" / "fedcba9876543210"
    chunk = version / "part_00000" / "nodes" / "_N" / "x" / "c" / "0" / "0"
    chunk.parent.mkdir(parents=True)
    chunk.write_bytes(b"\0" * 4096)
    (version / MANIFEST_COPY).write_bytes(b"{}")
    (version.parent / LATEST).write_bytes(b"{}")
    evict(str(tmp_path), 100)
    assert not chunk.exists()
    assert (version / MANIFEST_COPY).exists() and (version.parent / LATEST).exists()
