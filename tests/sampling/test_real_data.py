"""End to end on real graphs: GraphSAGE on Cora, temporal link prediction on Bitcoin OTC."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphstore
from sampling import LinkNeighborLoader, NeighborLoader
from tests.conftest import features_only_accuracy, shared_data


def _accuracy(model, loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for b in loader:
            out = model(b.x, b.edge_index)[: b.batch_size]
            correct += int((out.argmax(1) == b.y[: b.batch_size]).sum())
            total += b.batch_size
    return correct / total


@pytest.mark.slow
def test_graphsage_on_cora_reaches_the_known_accuracy(tmp_path):
    from torch_geometric.nn import GraphSAGE

    raw = shared_data("planetoid", "Cora", "raw")
    graphstore.ingest(f"planetoid:{raw}", tmp_path / "cora", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "cora")
    torch.manual_seed(0)
    train = NeighborLoader(ds, [10, 10], input_nodes="train_mask", batch_size=32, shuffle=True, seed=0)
    test = NeighborLoader(ds, [-1, -1], input_nodes="test_mask", batch_size=500)
    model = GraphSAGE(1433, 64, num_layers=2, out_channels=7, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(30):
        model.train()
        for b in train:
            opt.zero_grad()
            F.cross_entropy(model(b.x, b.edge_index)[: b.batch_size], b.y[: b.batch_size]).backward()
            opt.step()
    accuracy = _accuracy(model, test)
    baseline = features_only_accuracy(ds)  # the same split, features only: about 0.45
    assert accuracy >= max(0.75, baseline + 0.15), f"test accuracy {accuracy:.3f} on Cora's public split vs {baseline}"


def _bitcoin() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    path = shared_data("bitcoin_otc", "soc-sign-bitcoinotc.csv")
    table = np.loadtxt(path, delimiter=",", dtype=np.float64).astype(np.int64)  # unix times have fractions
    nodes, inverse = np.unique(table[:, :2], return_inverse=True)
    edges = inverse.reshape(-1, 2)
    order = np.argsort(table[:, 3], kind="stable")
    return edges[order, 0], edges[order, 1], table[order, 3], len(nodes)


class _LinkModel(torch.nn.Module):
    def __init__(self, num_nodes: int, dim: int = 32) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.emb = torch.nn.Embedding(num_nodes, dim)
        self.conv1, self.conv2 = SAGEConv(dim, dim), SAGEConv(dim, dim)

    def forward(self, batch) -> torch.Tensor:
        h = self.conv2(self.conv1(self.emb(batch.n_id), batch.edge_index).relu(), batch.edge_index)
        src, dst = batch.edge_label_index
        return (h[src] * h[dst]).sum(-1)


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    pos = labels == 1
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


@pytest.mark.slow
def test_temporal_link_prediction_on_bitcoin_otc(tmp_path):
    from torch_geometric.data import Data

    src, dst, time, n = _bitcoin()
    cut = int(0.8 * len(src))  # temporal split: the last 20% of edges (by time) are the test set
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=n, time=torch.from_numpy(time))
    graphstore.ingest(data, tmp_path / "btc", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "btc")
    index = torch.from_numpy(np.stack([src, dst]))
    t = torch.from_numpy(time)

    def loader(sl, shuffle):
        # node IDs in the dataset are global IDs: map the input IDs through orig_id
        return LinkNeighborLoader(ds, [10, 5], edge_label_index=_to_global(ds, index[:, sl]), edge_label_time=t[sl],
                                  time_attr="time", neg_sampling=dict(mode="binary", amount=1), batch_size=512,
                                  shuffle=shuffle, seed=0)

    torch.manual_seed(0)
    model = _LinkModel(n)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(3):
        model.train()
        for b in loader(slice(0, cut), True):
            # no sampled edge is later than the seed link of its (disjoint) subgraph
            assert b.time.numel() > 0 and (b.time <= b.edge_label_time[b.batch[b.edge_index[1]]]).all()
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(b), b.edge_label)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert np.mean(losses[-10:]) < np.mean(losses[:10]), "training did not lower the loss"
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for b in loader(slice(cut, None), False):
            scores.append(model(b).numpy())
            labels.append(b.edge_label.numpy())
    auc = _auc(np.concatenate(scores), np.concatenate(labels))
    assert auc > 0.6, f"AUC {auc:.3f} on the later 20% of edges"


def _to_global(ds, index: torch.Tensor) -> torch.Tensor:
    from graphstore.dataset.whole import DatasetFeatureStore

    orig = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()
    new = np.empty_like(orig)
    new[orig] = np.arange(len(orig))
    return torch.from_numpy(new[index.numpy()])
