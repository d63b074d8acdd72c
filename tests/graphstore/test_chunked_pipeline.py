"""The chunked pipeline: how the work is cut (edge blocks, node chunks, buckets) never changes the dataset."""

from __future__ import annotations

import numpy as np
import pytest

import graphstore
from graphstore.errors import InvalidInputError
from graphstore.ingest import chunked_graph, synthetic_chunks
from graphstore.ingest.budget import Budget
from graphstore.ingest.sources import as_chunked
from tests.conftest import assert_roundtrip, small_graph
from tests.graphstore.test_ingest_dask import _stored

SPEC = "synthetic:nodes=30000,avg_degree=8,features=6,classes=4,seed=2"


def test_csc_in_many_destination_blocks_is_the_same_dataset(tmp_path, monkeypatch):
    graphstore.ingest(SPEC, tmp_path / "one", num_parts=3, halo_features="x")
    monkeypatch.setattr(Budget, "route_block_edges", property(lambda self: 5000))  # ~16 blocks per part
    monkeypatch.setattr(Budget, "bucket_entries", property(lambda self: 50_000))  # ~10 adjacency buckets
    graphstore.ingest(SPEC, tmp_path / "many", num_parts=3, halo_features="x")
    assert _stored(str(tmp_path / "one")) == _stored(str(tmp_path / "many"))


def test_every_task_run_twice_writes_the_same_dataset(tmp_path, monkeypatch):
    """A task retried after its worker died half-way (some of its files and arrays written) rewrites them."""
    from graphstore.ingest.engine import LocalEngine

    graphstore.ingest(SPEC, tmp_path / "once", num_parts=3, halo_features="x")
    once = LocalEngine.map

    def twice(self, stage, fn, items, *args, **shared):
        return once(self, stage, lambda item, **kw: (fn(item, **kw), fn(item, **kw))[1], items, *args, **shared)

    monkeypatch.setattr(LocalEngine, "map", twice)
    graphstore.ingest(SPEC, tmp_path / "twice", num_parts=3, halo_features="x")
    assert _stored(str(tmp_path / "once")) == _stored(str(tmp_path / "twice"))


def test_node_chunks_of_any_size_give_the_same_dataset(tmp_path):
    source, expected = small_graph(n=3000, e=20000, seed=4)
    graphstore.ingest(source, tmp_path / "big", num_parts=3, halo_features="x,y")
    source, _ = small_graph(n=3000, e=20000, seed=4)
    chunked = chunked_graph.chunked_from_graph(source, 1500, chunk_nodes=333)  # 10 node, 14 edge chunks
    assert len(chunked.node_chunks) == 10 and len(chunked.edge_chunks) == 14
    graphstore.ingest(chunked, tmp_path / "small", num_parts=3, halo_features="x,y")
    assert _stored(str(tmp_path / "big")) == _stored(str(tmp_path / "small"))
    assert_roundtrip(graphstore.open_dataset(tmp_path / "small"), expected)


def test_synthetic_node_chunks_unaligned_to_halo_owners(tmp_path, monkeypatch):
    graphstore.ingest(SPEC, tmp_path / "a", num_parts=4, method="random", seed=3, halo_features="all")
    monkeypatch.setattr(synthetic_chunks, "NODE_CHUNK", 7000)
    graphstore.ingest(SPEC, tmp_path / "b", num_parts=4, method="random", seed=3, halo_features="all")
    assert _stored(str(tmp_path / "a")) == _stored(str(tmp_path / "b"))


def test_a_chunk_with_the_wrong_row_count_is_named(tmp_path):
    source, _ = small_graph(n=500, e=2000, seed=1)
    chunked = as_chunked(source)
    chunk = chunked.node_chunks[0]
    chunk.attrs = {**chunk.attrs, "x": np.zeros((10, source.nodes[None].attrs["x"].shape[1]), np.float32)}
    with pytest.raises(InvalidInputError, match=r"attribute 'x': nodes 0\.\.499 came with shape \[10, "):
        graphstore.ingest(chunked, tmp_path / "ds", num_parts=2)
    assert not (tmp_path / "ds").exists()


def test_a_block_sorts_alike_by_one_key_and_by_three_columns():
    """CSC order from one 8-byte (destination, source) key, and from three columns where that key would overflow."""
    from graphstore.ingest.edge_stage import _Sink, _sort_block

    rng = np.random.default_rng(5)
    n, lo = 5000, 1000
    dst = rng.integers(lo, lo + 300, n)
    src = np.where(rng.random(n) < 0.1, dst, rng.integers(0, 2000, n))  # self-loops and, by chance, duplicates
    src[:50], dst[:50] = src[50:100], dst[50:100]
    out = []
    for num_src in (2000, 2**62):  # 300 * 2**62 >= 2**63: the three-column sort
        sink = _Sink({})
        edges = {"src": src.astype(np.int32), "dst": dst.astype(np.int32), "eid": np.arange(n)}
        got = _sort_block(edges, lo, 300, num_src, sink, True)
        out.append((got, sink.found))
    (src1, eid1, deg1, perm1), found1 = out[0]
    (src2, eid2, deg2, _), found2 = out[1]
    order = np.lexsort((np.arange(n), src, dst))
    np.testing.assert_array_equal(src1, src[order])
    np.testing.assert_array_equal(eid1, order)
    np.testing.assert_array_equal(deg1, np.bincount(dst - lo, minlength=300))
    assert perm1 is None  # no edge attribute: no permutation kept
    np.testing.assert_array_equal(src2, src1)
    np.testing.assert_array_equal(eid2, eid1)
    np.testing.assert_array_equal(deg2, deg1)
    assert found1 == found2 and found1["loops"] == int(np.count_nonzero(src == dst)) and found1["dups"] >= 50


class _CountedChunk:
    """An edge chunk that notes every read of it."""

    def __init__(self, chunk, reads):
        self.chunk, self.reads, self.etype, self.start, self.stop = chunk, reads, chunk.etype, chunk.start, chunk.stop

    def read(self):
        self.reads.append(self.start)
        return self.chunk.read()


def test_route_reads_the_endpoints_partitioning_saved_not_the_source(tmp_path, monkeypatch):
    from graphstore.ingest.scratch import Scratch
    from graphstore.ingest.synthetic import parse_synthetic_spec

    reads = []
    source = synthetic_chunks.synthetic_chunked(parse_synthetic_spec(SPEC))
    source.edge_chunks = [_CountedChunk(c, reads) for c in source.edge_chunks]
    graphstore.ingest(source, tmp_path / "saved", num_parts=3)
    assert sorted(reads) == sorted(c.start for c in source.edge_chunks)  # each once: for the adjacency
    monkeypatch.setattr(Scratch, "keep_only", lambda self, name: self.remove(""))  # nothing saved: read again
    graphstore.ingest(SPEC, tmp_path / "read twice", num_parts=3)
    assert _stored(str(tmp_path / "saved")) == _stored(str(tmp_path / "read twice"))
