"""Derived arrays: per-part writes, one commit, readable through graphstore and plain Zarr, local and on S3."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import zarr

import graphstore
from graphstore.dataset import layout
from graphstore.dataset.whole import DatasetFeatureStore
from graphstore.errors import (CorruptDatasetError, DatasetExistsError, InvalidInputError, PartitionIndexError,
                               UnknownAttributeError)
from graphstore.outputs.writer import OutputWriter
from tests.conftest import small_graph, small_hetero

DIM = 16


def _embeddings(n: int, seed: int = 3) -> np.ndarray:
    """One row per input node ID: what a model would compute."""
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _orig_ids(ds) -> list[np.ndarray]:
    return [np.asarray(ds.array(layout.node_array(p, layout.HOMOGENEOUS_KEY, layout.ORIG_ID)))
            for p in range(ds.num_parts)]


def _write_all(writer: OutputWriter, ds, emb: np.ndarray) -> dict:
    """Each partition's rows, in global-ID order, as its owner would compute them (part 1 in a pickled copy)."""
    orig = _orig_ids(ds)
    infos = {0: writer.write_part(0, torch.from_numpy(emb[orig[0]]))}
    infos[1] = pickle.loads(pickle.dumps(writer)).write_part(1, emb[orig[1]])
    return infos


def _check_committed(ds, emb: np.ndarray) -> None:
    """Rows come back per part, over the whole dataset, and in input order through orig_id."""
    orig = _orig_ids(ds)
    for p in range(ds.num_parts):
        assert np.array_equal(ds.partition(p)[0][None, "emb", None].numpy(), emb[orig[p]])
    got = DatasetFeatureStore(ds)[None, "emb", None].numpy()
    back = np.empty_like(got)
    back[np.concatenate(orig)] = got
    assert np.array_equal(back, emb)
    assert ds.verify() == []


@pytest.fixture
def dest(tmp_path):
    graphstore.ingest(small_graph(n=300, e=1200)[0], tmp_path / "ds", num_parts=2, chunk_mb=0.01)
    return tmp_path / "ds"


def test_write_commit_and_read_back(dest):
    ds = graphstore.open_dataset(dest)
    emb = _embeddings(300)
    root = (dest / layout.ROOT_METADATA).read_bytes()
    writer = OutputWriter(ds, "emb", row_shape=(DIM,), description="test model, epoch 3")
    infos = _write_all(writer, ds, emb)
    assert all(info.num_chunks > 1 and info.compression == "none" for info in infos.values())
    assert (dest / layout.ROOT_METADATA).read_bytes() == root  # before the commit: nothing visible
    before = graphstore.open_dataset(dest)
    assert "emb" not in before.manifest.node_types[0].attrs and before.verify() == []
    with pytest.raises(UnknownAttributeError, match="no attribute 'emb'"):
        before.partition(0)[0][None, "emb", None]
    writer.commit(infos)
    after = graphstore.open_dataset(dest)
    _check_committed(after, emb)
    (entry,) = after.manifest.outputs
    assert (entry.name, entry.node_type, entry.description) == ("emb", None, "test model, epoch 3")
    assert after.manifest.without_outputs() == before.manifest
    group = zarr.open_group(str(dest), mode="r")  # any Zarr reader
    for p in range(2):
        assert np.array_equal(group[writer.path(p)][...], np.asarray(after.array(writer.path(p))))
    assert not list(dest.glob("*.partial"))


def test_refusals_name_the_fix(dest):
    ds = graphstore.open_dataset(dest)
    rows = np.zeros((ds.node_offsets()[1], DIM), np.float32)
    writer = OutputWriter(dest, "emb", row_shape=(DIM,))
    with pytest.raises(InvalidInputError, match=r"got 5 rows, but the partition owns \d+ nodes.*one row per"):
        writer.write_part(0, rows[:5])
    with pytest.raises(InvalidInputError, match=r"shape \(8,\), declared row_shape is \(16,\)"):
        writer.write_part(0, rows[:, :8])
    with pytest.raises(InvalidInputError, match="int32 without losing values"):
        OutputWriter(dest, "pred", dtype="int32").write_part(0, rows[:, 0])
    with pytest.raises(PartitionIndexError, match="0..1"):
        writer.write_part(2, rows)
    info = writer.write_part(0, rows)
    with pytest.raises(InvalidInputError, match=r"partition\(s\) \[1\] have no ArrayInfo; call write_part"):
        writer.commit({0: info})
    with pytest.raises(InvalidInputError, match="ArrayInfo of partition 1"):
        writer.commit({0: info, 1: info})
    with pytest.raises(DatasetExistsError, match="'x', written by ingest"):
        OutputWriter(dest, "x", row_shape=(8,), overwrite=True)
    for bad, match in [("a/b", "rename the attribute"), (layout.ORIG_ID, "reserved"), ("", "non-empty")]:
        with pytest.raises(InvalidInputError, match=match):
            OutputWriter(dest, bad)
    with pytest.raises(InvalidInputError, match="dtype 'complex64' cannot be stored"):
        OutputWriter(dest, "emb", dtype="complex64")
    with pytest.raises(UnknownAttributeError, match="node type 'paper'"):
        OutputWriter(dest, "emb", node_type="paper")
    assert graphstore.open_dataset(dest).manifest == ds.manifest  # nothing committed


def test_overwrite_replaces_an_output(dest):
    ds = graphstore.open_dataset(dest)
    first = OutputWriter(dest, "emb", row_shape=(DIM,))
    first.commit(_write_all(first, ds, _embeddings(300, seed=1)))
    with pytest.raises(DatasetExistsError, match="already has output 'emb'; pass overwrite=True"):
        OutputWriter(dest, "emb", row_shape=(DIM,))
    emb = _embeddings(300, seed=2)
    again = OutputWriter(dest, "emb", row_shape=(DIM,), overwrite=True)
    again.commit(_write_all(again, ds, emb))
    after = graphstore.open_dataset(dest)
    _check_committed(after, emb)
    assert [o.name for o in after.manifest.outputs] == ["emb"]


def test_a_re_ingested_dataset_is_refused_at_commit(dest):
    ds = graphstore.open_dataset(dest)
    writer = OutputWriter(ds, "emb", row_shape=(DIM,))
    infos = _write_all(writer, ds, _embeddings(300))
    graphstore.ingest(small_graph(n=300, e=1200, seed=5)[0], dest, num_parts=2, chunk_mb=0.01, overwrite=True)
    with pytest.raises(InvalidInputError, match="re-ingested.*recompute the output"):
        writer.commit(infos)
    assert graphstore.open_dataset(dest).manifest.outputs == ()


def test_commit_checks_the_arrays_are_stored(dest):
    ds = graphstore.open_dataset(dest)
    writer = OutputWriter(ds, "emb", row_shape=(DIM,))
    infos = _write_all(writer, ds, _embeddings(300))
    last = layout.chunk_key(writer.path(1), infos[1].num_chunks - 1, 2)
    (dest / last).unlink()
    with pytest.raises(CorruptDatasetError, match=r"is missing .*call write_part\(1, rows\) again"):
        writer.commit(infos)


def test_an_output_of_one_node_type_of_a_hetero_graph(tmp_path):
    graphstore.ingest(small_hetero()[0], tmp_path / "h", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "h")
    with pytest.raises(UnknownAttributeError, match="heterogeneous: pass node_type"):
        OutputWriter(ds, "emb")
    writer = OutputWriter(ds, "emb", node_type="author", row_shape=(4,), dtype="float16")
    emb = np.random.default_rng(0).standard_normal((120, 4)).astype(np.float32)  # cast to float16 on write
    key = ds.manifest.node_type("author").key
    orig = [np.asarray(ds.array(layout.node_array(p, key, layout.ORIG_ID))) for p in range(2)]
    writer.commit({p: writer.write_part(p, emb[orig[p]]) for p in range(2)})
    after = graphstore.open_dataset(tmp_path / "h")
    for p in range(2):
        got = after.partition(p)[0]["author", "emb", None]
        assert got.dtype == torch.float16 and np.array_equal(got.numpy(), emb[orig[p]].astype(np.float16))
    assert "emb" not in after.manifest.node_type("paper").attrs
    assert after.manifest.without_outputs() == ds.manifest and after.verify() == []


@pytest.mark.s3
def test_outputs_on_s3(s3, tmp_path):
    url = s3.url("ds")
    graphstore.ingest(small_graph(n=300, e=1200)[0], url, num_parts=2, chunk_mb=0.01,
                      storage_options=s3.storage_options)
    cache = tmp_path / "cache"
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    for part in range(2):
        ds.prefetch(part)
    root = s3.fs().cat_file(f"{s3.bucket}/ds/{layout.ROOT_METADATA}")
    emb = _embeddings(300)
    writer = OutputWriter(url, "emb", row_shape=(DIM,), storage_options=s3.storage_options)
    infos = _write_all(writer, ds, emb)
    assert s3.fs().cat_file(f"{s3.bucket}/ds/{layout.ROOT_METADATA}") == root
    before = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    assert "emb" not in before.manifest.node_types[0].attrs
    writer.commit(infos)
    after = graphstore.open_dataset(url, s3.storage_options, cache_dir=cache)
    after.partition(0)[0][None, "x", None]
    assert after.io_stats()["misses"] == 0  # the commit kept every cached chunk
    _check_committed(after, emb)
    assert after.io_stats()["misses"] == sum(info.num_chunks for info in infos.values())  # only the new chunks
    group = zarr.open_group(url, mode="r", storage_options=s3.storage_options)
    for p in range(2):
        assert np.array_equal(group[writer.path(p)][...], np.asarray(after.array(writer.path(p))))
