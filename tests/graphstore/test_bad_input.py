"""Every bad input gets an error naming the problem and the fix, and leaves nothing behind."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import graphstore
from graphstore.errors import (CorruptDatasetError, DatasetExistsError, DatasetNotFoundError, FormatVersionError,
                               InvalidInputError, PartitionIndexError, SourceNotFoundError, UnknownSourceError)
from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable
from tests.conftest import small_graph


def _graph(src, dst, n=4, **attrs):
    return GraphSource({None: NodeTable(n, {k: ArrayRows(v) for k, v in attrs.items()})},
                       {None: EdgeTable(np.asarray(src), np.asarray(dst))})


def _ingest_fails(tmp_path, data, match, exc=InvalidInputError, **kw):
    dest = tmp_path / "out"
    with pytest.raises(exc, match=match):
        graphstore.ingest(data, dest, **kw)
    assert not dest.exists(), "a failed ingest must leave nothing at DEST"
    assert not [p for p in os.listdir(tmp_path) if "partial" in p], "staging directory left behind"


@pytest.mark.parametrize("src,dst,match", [
    ([0, -1], [1, 2], r"source IDs: edge 1 has node ID -1, outside \[0, 4\)"),
    ([0, 1], [1, 4], r"destination IDs: edge 1 has node ID 4, outside \[0, 4\)"),
])
def test_edge_ids_out_of_range(tmp_path, src, dst, match):
    _ingest_fails(tmp_path, _graph(src, dst), match)


def test_feature_rows_must_match_node_count(tmp_path):
    _ingest_fails(tmp_path, _graph([0], [1], x=np.zeros((3, 2), np.float32)), r"'x' has 3 rows but num_nodes is 4")


def test_label_rows_must_match_node_count(tmp_path):
    _ingest_fails(tmp_path, _graph([0], [1], y=np.zeros(5, np.int64)), r"'y' has 5 rows but num_nodes is 4")


def test_nan_features_refused_unless_allowed(tmp_path):
    x = np.ones((4, 2), np.float32)
    x[2, 1] = np.nan
    _ingest_fails(tmp_path, _graph([0], [1], x=x), r"input ID 2 holds NaN or inf.*--allow-nan", method="range",
                  num_parts=1)
    x[2, 1] = np.inf
    graphstore.ingest(_graph([0], [1], x=x), tmp_path / "ok", allow_nan=True)
    assert np.isinf(graphstore.open_dataset(tmp_path / "ok").partition(0)[0][None, "x", None].numpy()[2, 1])


def test_unsupported_dtype(tmp_path):
    _ingest_fails(tmp_path, _graph([0], [1], s=np.array(["a", "b", "c", "d"])), r"dtype <U1.*convert it")


def test_unknown_source_scheme(tmp_path):
    _ingest_fails(tmp_path, "graphml:/x", r"unknown SOURCE 'graphml:/x'.*planetoid", exc=UnknownSourceError)
    _ingest_fails(tmp_path, "/just/a/path", r"must start with one of", exc=UnknownSourceError)


def test_missing_source_files(tmp_path):
    _ingest_fails(tmp_path, f"planetoid:{tmp_path / 'nope'}", r"does not exist", exc=SourceNotFoundError)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceNotFoundError):
        graphstore.ingest(f"planetoid:{empty}", tmp_path / "out")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip file")
    with pytest.raises((InvalidInputError, SourceNotFoundError)):
        graphstore.ingest(f"npz:{broken}", tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("parts,match", [(0, r"--parts 0 is invalid"), (-2, r"--parts -2 is invalid"),
                                         (5, r"--parts 5 is larger than the node count 4")])
def test_bad_partition_count(tmp_path, parts, match):
    _ingest_fails(tmp_path, _graph([0], [1]), match, num_parts=parts)


def test_empty_edge_list(tmp_path):
    _ingest_fails(tmp_path, _graph([], []), r"edge list is empty")


def test_unknown_method(tmp_path):
    _ingest_fails(tmp_path, _graph([0], [1]), r"partition method 'kahip'", method="kahip")


def test_dest_exists_needs_overwrite_and_old_data_survives_failures(tmp_path):
    source, _ = small_graph()
    dest = tmp_path / "ds"
    graphstore.ingest(source, dest, num_parts=2)
    before = graphstore.open_dataset(dest).manifest.provenance["created"]
    with pytest.raises(DatasetExistsError, match="pass --overwrite"):
        graphstore.ingest(source, dest)
    # a failing overwrite keeps the old dataset intact
    with pytest.raises(InvalidInputError):
        graphstore.ingest(_graph([0], [9]), dest, overwrite=True)
    assert graphstore.open_dataset(dest).manifest.provenance["created"] == before
    graphstore.ingest(source, dest, num_parts=3, overwrite=True)
    assert graphstore.open_dataset(dest).num_parts == 3


def test_non_dataset_directory_is_never_replaced(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "thesis.tex").write_text("precious")
    with pytest.raises(DatasetExistsError, match="not a graphstore dataset"):
        graphstore.ingest(_graph([0], [1]), dest, overwrite=True)
    assert (dest / "thesis.tex").read_text() == "precious"


def test_unknown_format_version(tmp_path):
    graphstore.ingest(_graph([0, 1], [1, 2]), tmp_path / "ds")
    meta_path = tmp_path / "ds" / "zarr.json"
    doc = json.loads(meta_path.read_text())
    doc["attributes"]["graphstore"]["format_version"] = 99
    meta_path.write_text(json.dumps(doc))
    with pytest.raises(FormatVersionError, match="format version 99.*reads version 1"):
        graphstore.open_dataset(tmp_path / "ds")


def test_missing_or_incomplete_dataset(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="zarr.json is missing"):
        graphstore.open_dataset(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    with pytest.raises(DatasetNotFoundError, match="no manifest"):
        graphstore.open_dataset(tmp_path / "half")


def test_partition_index_out_of_range(tmp_path):
    graphstore.ingest(_graph([0, 1], [1, 2]), tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    for bad in (2, -1, "0"):
        with pytest.raises(PartitionIndexError, match="has 2 partitions"):
            ds.partition(bad)


def test_truncated_chunk_is_refused_at_open(tmp_path):
    source, _ = small_graph()
    graphstore.ingest(source, tmp_path / "ds", num_parts=2, chunk_mb=0.01)
    ds = graphstore.open_dataset(tmp_path / "ds")
    path = "part_00001/nodes/_N/x"
    assert ds.manifest.arrays[path].num_chunks > 1
    chunk = tmp_path / "ds" / "part_00001" / "nodes" / "_N" / "x" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(CorruptDatasetError, match=r"chunk 1 .* truncated"):
        graphstore.open_dataset(tmp_path / "ds").partition(1)[0][None, "x", None]


def test_missing_chunk_is_refused(tmp_path):
    graphstore.ingest(_graph([0, 1], [1, 2]), tmp_path / "ds")
    os.remove(tmp_path / "ds" / "part_00000" / "edges" / "_N" / "indices" / "c" / "0")
    with pytest.raises(CorruptDatasetError, match="chunk 0 of part_00000/edges/_N/indices is missing"):
        graphstore.open_dataset(tmp_path / "ds")  # the open's structure check
    _, gs = graphstore.open_dataset(tmp_path / "ds", check=False).partition(0)
    with pytest.raises(CorruptDatasetError, match="chunk 0 of part_00000/edges/_N/indices is missing"):
        gs.get_edge_index(None, "csc")  # and, unchecked, the first read


def test_reserved_and_unsafe_names(tmp_path):
    _ingest_fails(tmp_path, _graph([0], [1], orig_id=np.zeros(4, np.int64)), r"'orig_id' is reserved")
    _ingest_fails(tmp_path, _graph([0], [1], **{"a/b": np.zeros(4)}), r"cannot be stored")
    for name in ("indices", "eid", "packed"):  # would overwrite the topology arrays of the same directory
        edges = EdgeTable(np.array([0]), np.array([1]), {name: ArrayRows(np.zeros(1))})
        _ingest_fails(tmp_path, GraphSource({None: NodeTable(4, {})}, {None: edges}), rf"'{name}' is reserved")
