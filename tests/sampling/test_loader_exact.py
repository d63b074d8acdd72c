"""Loader batches checked against the raw input: triplet positives are the seed links, hetero rows and
edges per type map back to the input graph (in-memory HeteroData and a partitioned dataset)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from sampling import LinkNeighborLoader, NeighborLoader
from tests.conftest import small_hetero


@pytest.mark.parametrize("backend", ["data", "dataset3"])
@pytest.mark.parametrize("given", [True, False], ids=["edge_label_index", "default"])
def test_triplet_positives_are_the_seed_links(graphs, backend, given):
    g = graphs[backend]
    label_index = torch.from_numpy(np.stack([g.src, g.dst])) if given else None  # by input edge ID
    loader = LinkNeighborLoader(g.data, [2], edge_label_index=label_index, batch_size=64, seed=0, shuffle=True,
                                neg_sampling=dict(mode="triplet", amount=3))
    pairs = []
    for b in loader:
        n_id = b.n_id.numpy()
        src, pos, neg = n_id[b.src_index.numpy()], n_id[b.dst_pos_index.numpy()], n_id[b.dst_neg_index.numpy()]
        if given or backend == "data":  # input_id: positions in edge_label_index (the input edge order)
            link = b.input_id.numpy()
            assert np.array_equal(src, g.src[link]) and np.array_equal(pos, g.dst[link])
        assert neg.shape == (len(src), 3) and (neg >= 0).all() and (neg < g.num_nodes).all()
        assert np.allclose(b.x.numpy(), g.x[n_id])
        ei, e_id = b.edge_index.numpy(), b.e_id.numpy()
        assert np.array_equal(n_id[ei[0]], g.src[e_id]) and np.array_equal(n_id[ei[1]], g.dst[e_id])
        pairs += zip(src.tolist(), pos.tolist())
    assert sorted(pairs) == sorted(zip(g.src.tolist(), g.dst.tolist())), "every edge is a positive once per epoch"


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    data, expected = small_hetero(seed=5)
    dest = tmp_path_factory.mktemp("hetero") / "ds"
    graphstore.ingest(data, dest, num_parts=2)
    return data, expected, graphstore.open_dataset(dest)


def _to_input(batch, ntype: str, from_dataset: bool) -> np.ndarray:
    """Input node IDs of a batch's nodes of ``ntype`` (datasets relabel; ``orig_id`` maps back)."""
    return batch[ntype].orig_id.numpy() if from_dataset else batch[ntype].n_id.numpy()


def _check_hetero_batch(batch, expected, from_dataset: bool) -> None:
    for ntype, attrs in expected.node_attrs.items():
        ids = _to_input(batch, ntype, from_dataset)
        if from_dataset:  # orig_id is the input ID of each global n_id
            assert len(ids) == batch[ntype].n_id.numel()
        assert np.allclose(batch[ntype].x.numpy(), attrs["x"][ids]), ntype
    for et, (src, dst) in expected.edges.items():
        if et not in batch.edge_types or batch[et].edge_index.numel() == 0:
            continue
        ei, e_id = batch[et].edge_index.numpy(), batch[et].e_id.numpy()
        assert np.array_equal(_to_input(batch, et[0], from_dataset)[ei[0]], src[e_id]), et
        assert np.array_equal(_to_input(batch, et[2], from_dataset)[ei[1]], dst[e_id]), et


def test_hetero_node_batches_map_back_to_the_input_per_type(hetero):
    data, expected, ds = hetero
    fanout = {et: [3, 2] for et in data.edge_types}
    for source in (data, ds):
        edges = 0
        for batch in NeighborLoader(source, fanout, input_nodes=("paper", None), batch_size=64, seed=0):
            _check_hetero_batch(batch, expected, source is ds)
            edges += sum(batch[et].edge_index.size(1) for et in batch.edge_types)
        assert edges > 0


def test_hetero_triplet_positives_are_real_edges(hetero):
    data, expected, ds = hetero
    et = ("author", "writes", "paper")
    src, dst = expected.edges[et]
    fanout = {t: [3, 2] for t in data.edge_types}
    for source in (data, ds):
        label_index = None if source is ds else data[et].edge_index
        loader = LinkNeighborLoader(source, fanout, edge_label_index=(et, label_index), batch_size=100, seed=0,
                                    neg_sampling=dict(mode="triplet", amount=2))
        real = set(zip(src.tolist(), dst.tolist()))
        count = 0
        for b in loader:
            _check_hetero_batch(b, expected, source is ds)
            s = _to_input(b, "author", source is ds)[b["author"].src_index.numpy()]
            p = _to_input(b, "paper", source is ds)[b["paper"].dst_pos_index.numpy()]
            assert all(pair in real for pair in zip(s.tolist(), p.tolist())), "a positive is not an edge"
            if source is data:
                link = b["author", "writes", "paper"].input_id.numpy()
                assert np.array_equal(s, src[link]) and np.array_equal(p, dst[link])
            count += len(s)
        assert count == len(src), "every link once per epoch"
