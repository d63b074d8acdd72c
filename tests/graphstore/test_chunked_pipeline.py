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
