"""``graphstore.ingest`` arguments that only some sources used before: ``to_undirected`` for every source."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

import graphstore
from graphstore.dataset_stores import DatasetFeatureStore, DatasetGraphStore
from tests.conftest import small_graph


def _edge_set(ds) -> set[tuple[int, int]]:
    orig = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()  # global -> input ID
    src, dst = DatasetGraphStore(ds).get_edge_index(None, "coo")
    return set(zip(orig[src.numpy()].tolist(), orig[dst.numpy()].tolist()))


def test_to_undirected_applies_to_in_memory_sources(tmp_path):
    ei = torch.tensor([[0, 1, 2, 4], [1, 2, 3, 0]])
    data = Data(edge_index=ei, num_nodes=5)
    graphstore.ingest(data, tmp_path / "a", to_undirected=True)
    want = {(s, d) for s, d in ei.t().tolist()} | {(d, s) for s, d in ei.t().tolist()}
    assert _edge_set(graphstore.open_dataset(tmp_path / "a")) == want
    graphstore.ingest(data, tmp_path / "b")
    assert _edge_set(graphstore.open_dataset(tmp_path / "b")) == {(s, d) for s, d in ei.t().tolist()}

    source, expected = small_graph(n=50, e=120)
    before = source.edges[None].num_edges
    graphstore.ingest(source, tmp_path / "c", to_undirected=True)
    assert source.edges[None].num_edges == before  # the caller's source is left as it was
    src, dst = expected.edges[None]
    ds = graphstore.open_dataset(tmp_path / "c")
    assert ds.manifest.edge_types[0].num_edges == 2 * len(src)
    assert _edge_set(ds) == set(zip(src.tolist(), dst.tolist())) | set(zip(dst.tolist(), src.tolist()))
