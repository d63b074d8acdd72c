"""Datasets on S3 (a local moto server): ingest, open from several processes, cache, errors, CLI, overwrite."""

from __future__ import annotations

import json
import multiprocessing
import pickle

import numpy as np
import pytest
import torch

import graphstore
from graphstore.ingest.sources import as_chunked
from graphstore.dataset import layout
from graphstore.cli.app import main
from graphstore.errors import (DatasetExistsError, DatasetNotFoundError, InvalidInputError, StorageNotFoundError,
                               StoragePermissionError)
from graphstore.storage.integrity import metadata_paths
from graphstore.storage.local import LocationWrapper, open_location
from tests.conftest import assert_roundtrip, shared_data, small_graph, small_hetero
from tests.graphstore.conftest import ACCESS_KEY, SECRET_KEY, fake_credentials, new_bucket, start_moto

pytestmark = pytest.mark.s3


def _arrays_equal(ds, local) -> None:
    """Every stored array and a few random gathers per attribute: identical to the local dataset."""
    rng = np.random.default_rng(0)
    for part in range(ds.num_parts):
        fs, lfs = ds.partition(part)[0], local.partition(part)[0]
        for attr in lfs.get_all_tensor_attrs():
            lo, hi = (local.node_offsets(attr.group_name)[part: part + 2] if local.is_hetero
                      else local.node_offsets()[part: part + 2])
            for _ in range(3):
                ids = torch.from_numpy(rng.integers(lo, hi, 64)) if hi > lo else torch.zeros(0, dtype=torch.long)
                assert torch.equal(fs[attr.group_name, attr.attr_name, ids], lfs[attr.group_name, attr.attr_name, ids])
    for path in sorted(local.manifest.arrays):
        assert np.array_equal(np.asarray(ds.array(path)), np.asarray(local.array(path))), path


def _reader(url: str | graphstore.Dataset, options: dict, cache_dir: str, local_dir: str) -> dict:
    ds = url if isinstance(url, graphstore.Dataset) else graphstore.open_dataset(url, options, cache_dir=cache_dir)
    _arrays_equal(ds, graphstore.open_dataset(local_dir))
    return ds.io_stats()


def _ingest_both(source_fn, s3, tmp_path, name: str, **kwargs):
    url, local = s3.url(name), tmp_path / name
    graphstore.ingest(source_fn(), url, storage_options=s3.storage_options, **kwargs)
    graphstore.ingest(source_fn(), local, **kwargs)
    return url, local


@pytest.mark.slow
def test_cora_and_hetero_from_s3_in_two_processes(s3, tmp_path):
    cora = f"planetoid:{shared_data('planetoid', 'Cora', 'raw')}"
    hetero, expected = small_hetero()
    datasets = [_ingest_both(lambda: cora, s3, tmp_path, "cora", num_parts=2, seed=1, chunk_mb=1),
                _ingest_both(lambda: hetero, s3, tmp_path, "hetero", num_parts=2, seed=1, chunk_mb=0.01)]
    cache = str(tmp_path / "cache")
    opened = graphstore.open_dataset(datasets[1][0], s3.storage_options, cache_dir=cache)
    assert_roundtrip(opened, expected)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:  # two processes on one machine, one shared cache, at once
        for url, local in datasets:
            source = url if url.endswith("cora") else opened  # the opened dataset pickles, without clients
            runs = [pool.apply_async(_reader, (source, s3.storage_options, cache, str(local))) for _ in range(2)]
            stats = [run.get(timeout=300) for run in runs]
            chunks = sum(a.num_chunks for a in graphstore.open_dataset(local).manifest.arrays.values())
            if source is url:  # nothing cached before: every chunk downloaded exactly once between them
                assert sum(s["misses"] for s in stats) == chunks
                assert sum(s["hits"] for s in stats) == chunks
            assert sum(s["misses"] + s["hits"] for s in stats) == 2 * chunks


@pytest.mark.slow
def test_a_second_pass_is_free_and_survives_the_server_stopping(monkeypatch, tmp_path):
    server, endpoint = start_moto()  # this test's own server: it stops it
    try:
        fake_credentials(monkeypatch, tmp_path)
        s3 = new_bucket(endpoint)
        source, expected = small_graph(n=3000, e=12000, seed=7, features=32)
        graphstore.ingest(source, s3.url("ds"), num_parts=2, chunk_mb=0.02, storage_options=s3.storage_options)
        ds = graphstore.open_dataset(s3.url("ds"), s3.storage_options, cache_dir=tmp_path / "cache")
        assert_roundtrip(ds, expected)
        first = ds.io_stats()
        assert first["misses"] > 10 and first["requests"] == first["misses"] + 1  # + the manifest
        assert_roundtrip(ds, expected)
        assert ds.io_stats()["requests"] == first["requests"]  # zero new requests
    finally:
        server.stop()
    assert_roundtrip(ds, expected)  # the server is gone; the cache serves
    offline = pickle.loads(pickle.dumps(ds))
    assert_roundtrip(offline, expected)
    stats = offline.io_stats()
    assert stats["requests"] == 0 and stats["hits"] == first["misses"]


def _no_secret(text: str) -> None:
    assert SECRET_KEY not in text and ACCESS_KEY not in text and "opt-secret-value" not in text


def test_errors_are_clear_and_hold_no_secret(s3, tmp_path, monkeypatch, capsys):
    graphstore.ingest(small_graph(n=300, e=900)[0], s3.url("ds"), storage_options=s3.storage_options)
    with pytest.raises(DatasetNotFoundError, match=rf"no graphstore dataset at s3://{s3.bucket}/nothing") as err:
        graphstore.open_dataset(s3.url("nothing"), s3.storage_options)
    _no_secret(str(err.value))
    options = {**s3.storage_options, "key": "AKIAOPTIONKEY", "secret": "opt-secret-value"}
    with pytest.raises(StorageNotFoundError, match="s3://gs-no-such-bucket/ds.* bucket .*does not exist") as err:
        graphstore.open_dataset("s3://gs-no-such-bucket/ds", options)
    _no_secret(str(err.value))
    with pytest.raises(StorageNotFoundError, match="'gs-no-such-bucket' .* does not exist"):
        graphstore.ingest(small_graph(n=300, e=900)[0], "s3://gs-no-such-bucket/ds", storage_options=options)
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks credentials from now on
    for opts in (s3.storage_options, options):
        denied = rf"access to s3://{s3.bucket}/ds was denied.*credentials"
        with pytest.raises(StoragePermissionError, match=denied) as err:
            graphstore.open_dataset(s3.url("ds"), opts)
        _no_secret(str(err.value))
    assert main(["info", s3.url("ds"), *s3.cli_options(), "--storage-option", "secret=opt-secret-value",
                 "--storage-option", "key=AKIAOPTIONKEY"]) == 2
    captured = capsys.readouterr()
    assert "denied" in captured.err
    _no_secret(captured.out + captured.err)


@pytest.mark.slow
def test_the_cli_on_s3(s3, tmp_path, capsys):
    spec = "synthetic:nodes=3000,avg_degree=5,features=16,classes=3,seed=2"
    url, cache = s3.url("cli"), ["--cache-dir", str(tmp_path / "cache")]
    assert main(["ingest", spec, url, "--parts", "2", "--chunk-mb", "0.02", "--json", *s3.cli_options()]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dest"] == url and summary["checksums_read_back"] == 0
    assert main(["info", url, "--prefetch", "all", "--io", "--json", *s3.cli_options(), *cache]) == 0
    info = json.loads(capsys.readouterr().out)
    chunks = sum(len(a["checksums"]) for a in graphstore.open_dataset(url, s3.storage_options).manifest.to_json()
                 ["arrays"].values())
    assert info["io"]["misses"] == chunks and info["io"]["requests"] == chunks + 1
    assert main(["info", url, "--prefetch", "0", "--io", *s3.cli_options(), *cache]) == 0
    assert "io: 1 requests" in capsys.readouterr().out  # partition 0 is cached: only the manifest
    assert main(["verify", url, "--io", *s3.cli_options(), *cache]) == 0
    out = capsys.readouterr().out
    docs = len(metadata_paths(graphstore.open_dataset(url, s3.storage_options).manifest))  # group/array zarr.json
    assert f"all {chunks} chunks match" in out and f"io: {chunks + docs + 1} requests" in out
    key = f"{s3.bucket}/cli/{layout.chunk_key('part_00001/nodes/_N/x', 0, 2)}"
    raw = bytearray(s3.fs().cat_file(key))
    raw[3] ^= 0xFF
    s3.fs().pipe_file(key, bytes(raw))
    assert main(["verify", url, *s3.cli_options(), *cache]) == 1
    assert "part_00001/nodes/_N/x: chunk 0" in capsys.readouterr().err


class Recording(LocationWrapper):
    """Records deletions, to check the order of an overwrite on object storage."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    def remove_key(self, key):
        self.calls.append(f"remove_key {key}")
        super().remove_key(key)

    def remove(self):
        self.calls.append("remove")
        super().remove()


@pytest.mark.slow
def test_overwrite_on_s3_deletes_the_manifest_first_and_never_for_bad_input(s3):
    source, _ = small_graph(n=500, e=2000, seed=1)
    url = s3.url("ow")
    graphstore.ingest(source, url, num_parts=2, storage_options=s3.storage_options)
    with pytest.raises(DatasetExistsError, match="--overwrite"):
        graphstore.ingest(small_graph(n=500, e=2000, seed=2)[0], url, storage_options=s3.storage_options)
    bad, bad_values = small_graph(n=500, e=2000, seed=3)
    bad_values.node_attrs[None]["x"][400, 2] = np.nan  # the array the source reads from
    with pytest.raises(InvalidInputError, match="NaN"):
        graphstore.ingest(bad, url, num_parts=2, overwrite=True, storage_options=s3.storage_options)
    assert graphstore.open_dataset(url, s3.storage_options).verify() == []  # bad input deleted nothing
    out_of_range, _ = small_graph(n=500, e=2000, seed=3)
    out_of_range.edges[None].dst[1500] = 500  # read chunk by chunk: found by the check before the overwrite
    with pytest.raises(InvalidInputError, match=r"edge 1500 has node ID 500, outside \[0, 500\)"):
        graphstore.ingest(as_chunked(out_of_range), url, num_parts=2, method="random", overwrite=True,
                          storage_options=s3.storage_options)
    assert graphstore.open_dataset(url, s3.storage_options).verify() == []
    source, expected = small_graph(n=500, e=2000, seed=4)
    location = Recording(open_location(url, s3.storage_options))
    graphstore.ingest(source, location, num_parts=2, overwrite=True)
    assert location.calls == [f"remove_key {layout.ROOT_METADATA}", "remove"]
    assert_roundtrip(graphstore.open_dataset(url, s3.storage_options), expected)
    # an interrupted ingest (arrays, no manifest) never opens, and the next ingest replaces it
    open_location(url, s3.storage_options).remove_key(layout.ROOT_METADATA)
    s3.fs().pipe_file(f"{s3.bucket}/ow/{layout.ROOT_METADATA}", b'{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(DatasetNotFoundError, match="no manifest"):
        graphstore.open_dataset(url, s3.storage_options)
    graphstore.ingest(source, url, num_parts=2, storage_options=s3.storage_options)
    assert_roundtrip(graphstore.open_dataset(url, s3.storage_options), expected)
