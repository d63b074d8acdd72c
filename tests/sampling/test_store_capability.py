"""The sampler reads a store's topology by what the store says it serves, not by its class."""

from __future__ import annotations

import numpy as np

import graphstore
from sampling.graph.topology import from_graph_store
from tests.conftest import small_graph


class PartsView:
    """A store type the library has never seen: it only names the dataset partitions it serves."""

    def __init__(self, dataset, parts):
        self.dataset_parts = (dataset, parts)


def test_a_new_store_naming_its_partitions_is_memory_mapped(tmp_path):
    graphstore.ingest(small_graph(n=300, e=2000)[0], tmp_path / "ds", num_parts=3)
    ds = graphstore.open_dataset(tmp_path / "ds")
    topo = from_graph_store(PartsView(ds, [1, 2]), "weight", "time")[None]
    assert [b.part for b in topo.blocks] == [1, 2]
    assert all(len(b.weight) == len(b.indices) == len(b.time) > 0 for b in topo.blocks)
    for block in topo.blocks:  # the same arrays the partition's own graph store hands out
        indices, indptr = (t.numpy() for t in ds.partition(block.part)[1].get_edge_index(None, "csc"))
        assert np.array_equal(block.indices, indices) and np.array_equal(block.indptr, indptr)
        assert np.array_equal(block.eid, ds.partition(block.part)[1].edge_ids(None).numpy())


def test_the_shipped_stores_declare_their_partitions(tmp_path):
    from graphstore.dataset.whole import DatasetGraphStore

    graphstore.ingest(small_graph(n=200, e=800)[0], tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    assert ds.partition(1)[1].dataset_parts == (ds, [1])
    assert DatasetGraphStore(ds).dataset_parts == (ds, [0, 1])
    whole = from_graph_store(DatasetGraphStore(ds), None, None)[None]
    assert [b.part for b in whole.blocks] == [0, 1] and whole.num_dst == 200
