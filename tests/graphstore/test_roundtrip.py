"""Ingest → open round trips: every edge and every row comes back exactly, through orig_id."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from tests.conftest import Expected, assert_roundtrip, shared_data, small_graph, small_hetero


@pytest.mark.parametrize("method", ["metis", "random", "range"])
@pytest.mark.parametrize("num_parts", [1, 3])
def test_small_graph_roundtrip(tmp_path, method, num_parts):
    source, expected = small_graph()
    summary = graphstore.ingest(source, tmp_path / "ds", num_parts=num_parts, method=method, chunk_mb=0.01)
    ds = graphstore.open_dataset(tmp_path / "ds")
    assert ds.num_parts == num_parts == summary.num_parts
    assert sum(summary.edges_per_part) == 4000 and sum(summary.nodes_per_part) == 600
    assert_roundtrip(ds, expected)
    # chunk_mb=0.01 forces several chunks per array, mapped back to back
    assert max(a.num_chunks for a in ds.manifest.arrays.values()) > 1


def test_cora_roundtrip_all_methods(tmp_path):
    from graphstore.ingest.read_planetoid import read_planetoid

    raw = shared_data("planetoid", "Cora", "raw")
    reference = read_planetoid(str(raw))
    table, edges = reference.nodes[None], reference.edges[None]
    everything = np.arange(table.num_nodes)
    expected = Expected({None: table.num_nodes}, {None: {k: v.take(everything) for k, v in table.attrs.items()}},
                        {None: (edges.src, edges.dst)})
    for method in ("metis", "random", "range"):
        dest = tmp_path / method
        summary = graphstore.ingest(f"planetoid:{raw}", dest, num_parts=2, method=method)
        ds = graphstore.open_dataset(dest)
        assert ds.name == "cora" and ds.num_nodes() == 2708
        assert ds.manifest.edge_types[0].num_edges == 10556
        assert ds.metadata["splits"]["_N"] == {"train_mask": 140, "val_mask": 500, "test_mask": 1000}
        assert_roundtrip(ds, expected)
        if method == "metis":
            metis_cut = summary.edge_cut_fraction
        else:
            assert metis_cut < summary.edge_cut_fraction / 2, "METIS should cut far fewer edges than random/range"


def test_synthetic_source_roundtrip(tmp_path):
    from graphstore.ingest.synthetic import parse_synthetic_spec
    from graphstore.ingest.synthetic_chunks import synthetic_graph

    spec = "nodes=3000,avg_degree=6,features=12,classes=4,seed=3"
    ref = synthetic_graph(parse_synthetic_spec(spec))
    table = ref.nodes[None]
    expected = Expected({None: 3000}, {None: {k: v.take(np.arange(3000)) for k, v in table.attrs.items()}},
                        {None: (ref.edges[None].src, ref.edges[None].dst)})
    graphstore.ingest(f"synthetic:{spec}", tmp_path / "syn", num_parts=2)
    assert_roundtrip(graphstore.open_dataset(tmp_path / "syn"), expected)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_hetero_roundtrip(tmp_path, method):
    data, expected = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=2, method=method)
    ds = graphstore.open_dataset(tmp_path / "h")
    assert ds.is_hetero and set(ds.node_types) == {"paper", "author"}
    assert set(ds.edge_types) == set(data.edge_types)
    assert_roundtrip(ds, expected)
    # every node type is split across both partitions: contiguous range per type and partition
    for ntype in ds.node_types:
        assert (np.diff(ds.node_offsets(ntype)) > 0).all()


def test_halo_replicas_answer_for_remote_sources(tmp_path):
    source, expected = small_graph()
    graphstore.ingest(source, tmp_path / "ds", num_parts=3, halo_features="x,y")
    ds = graphstore.open_dataset(tmp_path / "ds")
    x_by_input = expected.node_attrs[None]["x"]
    order = np.concatenate([ds.partition(p)[0][None, "orig_id", None].numpy() for p in range(3)])
    for p in range(3):
        fs, gs = ds.partition(p)
        indices, _ = gs.get_edge_index(None, "csc")
        lo, hi = gs.dst_range()
        remote = np.unique(indices.numpy()[(indices.numpy() < lo) | (indices.numpy() >= hi)])
        assert len(remote) > 0
        mixed = torch.from_numpy(np.concatenate([remote[:50], np.arange(lo, lo + 20)]))
        assert np.array_equal(fs[None, "x", mixed].numpy(), x_by_input[order[mixed.numpy()]])
        with pytest.raises(KeyError, match="owned by partition"):
            fs[None, "train_mask", torch.from_numpy(remote[:3])]  # not replicated


def test_self_loops_duplicates_and_isolated_nodes_are_kept(tmp_path):
    from graphstore.ingest import EdgeTable, GraphSource, NodeTable

    src = np.array([0, 0, 0, 1, 2, 2])
    dst = np.array([0, 1, 1, 2, 2, 0])  # two self-loops, one duplicate; nodes 3 and 4 isolated
    g = GraphSource({None: NodeTable(5)}, {None: EdgeTable(src, dst)})
    graphstore.ingest(g, tmp_path / "d", num_parts=2, method="range")
    ds = graphstore.open_dataset(tmp_path / "d")
    assert ds.metadata["stats"] == {"self_loops": 2, "duplicate_edges": 1, "isolated_nodes": 2}
    assert_roundtrip(ds, Expected({None: 5}, {}, {None: (src, dst)}))


def test_zstd_compressed_dataset_reads_the_same(tmp_path):
    source, expected = small_graph(seed=4)
    graphstore.ingest(source, tmp_path / "z", num_parts=2, compression="zstd")
    ds = graphstore.open_dataset(tmp_path / "z")
    assert {a.compression for a in ds.manifest.arrays.values()} == {"zstd"}
    assert_roundtrip(ds, expected)
    fs, _ = ds.partition(0)
    ids = torch.tensor([3, 1, 3, 0])
    order = fs[None, "orig_id", None].numpy()
    assert np.array_equal(fs[None, "x", ids].numpy(), expected.node_attrs[None]["x"][order[ids.numpy()]])
