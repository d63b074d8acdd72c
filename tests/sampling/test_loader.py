"""NeighborLoader / LinkNeighborLoader: PyG's arguments, batches with features, workers, hetero, links."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from sampling import LinkNeighborLoader, NeighborLoader

BACKENDS = ["data", "dataset1", "dataset3"]


@pytest.fixture(params=BACKENDS)
def g(request, graphs):
    return graphs[request.param]


def test_node_batches_carry_features_ids_and_sizes(g):
    loader = NeighborLoader(g.data, [4, 4], input_nodes=torch.arange(0, 100), batch_size=32, shuffle=True, seed=0)
    seen = []
    for batch in loader:
        assert batch.x.shape == (batch.n_id.numel(), 4)
        assert np.allclose(batch.x.numpy(), g.x[batch.n_id.numpy()])
        assert batch.edge_index.size(1) == batch.e_id.numel() == sum(batch.num_sampled_edges)
        src, dst = batch.n_id[batch.edge_index[0]].numpy(), batch.n_id[batch.edge_index[1]].numpy()
        assert np.array_equal(src, g.src[batch.e_id.numpy()]) and np.array_equal(dst, g.dst[batch.e_id.numpy()])
        assert torch.equal(batch.n_id[: batch.batch_size], batch.input_id)
        seen.append(batch.input_id)
    assert sorted(torch.cat(seen).tolist()) == list(range(100))
    assert len(loader) == 4


def test_dataset_batches_carry_edge_attributes(graphs):
    g = graphs["dataset3"]
    batch = next(iter(NeighborLoader(g.data, [5], input_nodes=torch.arange(50), batch_size=50)))
    assert np.allclose(batch.weight.numpy(), g.weight[batch.e_id.numpy()])
    assert np.array_equal(batch.edge_time.numpy(), g.edge_time[batch.e_id.numpy()])
    assert "orig_id" in batch and np.array_equal(batch.orig_id.numpy(), g.to_input[batch.n_id.numpy()])


def test_masks_by_name_and_all_nodes_by_default(graphs):
    g = graphs["dataset1"]
    loader = NeighborLoader(g.data, [2], batch_size=1000)
    assert next(iter(loader)).batch_size == 400
    ds = g.data
    with pytest.raises(KeyError, match="no attribute 'train_mask'"):
        NeighborLoader(ds, [2], input_nodes="train_mask")


@pytest.mark.slow
@pytest.mark.parametrize("context, filter_per_worker", [(None, None), ("spawn", None), (None, True)])
def test_workers_load_the_same_batches(graphs, context, filter_per_worker):
    """Rows are fetched in the main process by default for datasets (the sampler output, with its
    edge locator, crosses from the worker), or in the workers when asked."""
    g = graphs["dataset3"]
    kwargs = dict(input_nodes=torch.arange(200), batch_size=25, seed=0)
    ids0 = sorted(torch.cat([b.input_id for b in NeighborLoader(g.data, [3, 3], **kwargs)]).tolist())
    loader = NeighborLoader(g.data, [3, 3], num_workers=2, persistent_workers=False,
                            multiprocessing_context=context, filter_per_worker=filter_per_worker, **kwargs)
    assert loader.filter_per_worker is bool(filter_per_worker)
    batches = list(loader)
    assert sorted(torch.cat([b.input_id for b in batches]).tolist()) == ids0
    for b in batches:
        assert np.allclose(b.x.numpy(), g.x[b.n_id.numpy()])
        assert np.allclose(b.weight.numpy(), g.weight[b.e_id.numpy()])


def test_link_loader_binary_negatives(g):
    loader = LinkNeighborLoader(g.data, [3, 2], edge_label_index=torch.from_numpy(np.stack([g.src, g.dst]))[:, :300],
                                batch_size=100, neg_sampling=dict(mode="binary", amount=2), seed=0)
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        labels = b.edge_label
        assert labels.numel() == 300 and int(labels.sum()) == 100 and set(labels.tolist()) == {0.0, 1.0}
        pairs = b.n_id[b.edge_label_index]
        pos = pairs[:, labels == 1].numpy()
        exists = set(zip(g.src.tolist(), g.dst.tolist()))
        assert all((s, d) in exists for s, d in zip(*pos))
        assert (pairs >= 0).all() and (pairs < g.num_nodes).all()


def test_link_loader_triplet_negatives(graphs):
    g = graphs["dataset3"]
    loader = LinkNeighborLoader(g.data, [2], batch_size=64, neg_sampling=dict(mode="triplet", amount=3), seed=0)
    b = next(iter(loader))
    assert b.src_index.numel() == 64 and b.dst_pos_index.numel() == 64
    assert b.dst_neg_index.shape == (64, 3)
    assert len(loader) == int(np.ceil(len(g.src) / 64))


def test_hetero_dataset_feeds_a_to_hetero_model(tmp_path):
    from torch_geometric.datasets import FakeHeteroDataset
    from torch_geometric.nn import SAGEConv, to_hetero

    data = FakeHeteroDataset(num_node_types=2, num_edge_types=4, avg_num_nodes=200, num_classes=3)[0]
    graphstore.ingest(data, tmp_path / "h", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "h")
    target = "v0"
    for source in (data, ds):
        loader = NeighborLoader(source, {et: [3, 2] for et in data.edge_types}, input_nodes=(target, None),
                                batch_size=16, seed=0)
        batch = next(iter(loader))
        assert batch[target].batch_size == 16 and set(batch.node_types) == set(data.node_types)
        for et in data.edge_types:
            ei = batch[et].edge_index
            if ei.numel():
                assert ei[0].max() < batch[et[0]].num_nodes and ei[1].max() < batch[et[2]].num_nodes

        class GNN(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = SAGEConv((-1, -1), 16), SAGEConv((-1, -1), 3)

            def forward(self, x, edge_index):
                return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

        model = to_hetero(GNN(), data.metadata(), aggr="sum")
        out = model(batch.x_dict, batch.edge_index_dict)[target][: batch[target].batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch[target].y[:16])
        loss.backward()
        assert out.shape == (16, 3) and torch.isfinite(loss)
