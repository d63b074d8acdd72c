"""The samples of every variant, pinned: a change to the kernels that is meant to be faster only must draw
exactly what was drawn before (a SHA-256 of every output tensor of one batch per variant and backend).

A change that is meant to draw differently updates the digest it changes, and says why in its commit.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

from sampling import NeighborSampler

# name -> (sampler options, fanout, seed times: None, a fixed time, or "spread")
CASES = {
    "plain": ({}, [5, 3], None),
    "plain_replace": ({"replace": True}, [5, 3], None),
    "plain_all": ({}, [-1, 2], None),
    "weighted": ({"weight_attr": "weight"}, [5, 3], None),
    "weighted_large_k": ({"weight_attr": "weight"}, [12, 12], None),
    "temporal_uniform_middle": ({"time_attr": "edge_time"}, [5, 3], 500),
    "temporal_uniform_late": ({"time_attr": "edge_time"}, [5, 3], 1000),
    "temporal_uniform_spread": ({"time_attr": "edge_time"}, [12, 12], "spread"),
    "temporal_last_middle": ({"time_attr": "edge_time", "temporal_strategy": "last"}, [5, 3], 500),
    "temporal_last_spread": ({"time_attr": "edge_time", "temporal_strategy": "last"}, [12, 12], "spread"),
    "temporal_node_time": ({"time_attr": "time"}, [5, 3], "spread"),
    "temporal_weighted": ({"time_attr": "edge_time", "weight_attr": "weight"}, [5, 3], "spread"),
    "disjoint": ({"disjoint": True}, [5, 3], None),
}
DIGESTS = {
    "data": {
        "plain": "8bcf0945870d648e",
        "plain_replace": "c41f04fcfd24307c",
        "plain_all": "a0a6358217dedce8",
        "weighted": "df629f6bbce6fd3e",
        "weighted_large_k": "e2420255a60a179c",
        "temporal_uniform_middle": "43468707bff6e405",
        "temporal_uniform_spread": "42e9ab520f99a041",
        "temporal_last_middle": "4d228f375795c7e4",
        "temporal_last_spread": "53ee470e7f0e0692",
        "temporal_node_time": "249ed611dc9361ff",
        "temporal_weighted": "e05aeb0eebeb5015",
        "disjoint": "035000bad139312b",
    },
    "dataset3": {
        "plain": "addf703f409a4773",
        "plain_replace": "2d86fbd61ad62694",
        "plain_all": "0e07e85372e07098",
        "weighted": "1f1f91c4302620aa",
        "weighted_large_k": "560baeb14f2e8ee8",
        "temporal_uniform_middle": "764980f3012608fa",
        "temporal_uniform_spread": "0e650ab84e31d5af",
        "temporal_last_middle": "1e08a9734ecdaee1",
        "temporal_last_spread": "a2540206bdabacef",
        "temporal_node_time": "c6cd7038dbb41cfb",
        "temporal_weighted": "872a5af5d3e4a16d",
        "disjoint": "49028829448e1300",
    },
}
for pinned in DIGESTS.values():  # every edge eligible (limits after the latest time): the plain picks over the
    pinned["temporal_uniform_late"] = pinned["disjoint"]  # CSC pairs, so exactly what disjoint sampling draws
DIGESTS["dataset1"] = DIGESTS["data"]  # a one-partition dataset draws what the graph in memory draws


def _digest(out) -> str:
    h = hashlib.sha256()
    for t in (out.node, out.row, out.col, out.edge, out.batch):
        h.update(b"-" if t is None else t.numpy().astype(np.int64).tobytes())
    return h.hexdigest()[:16]


def _digests(graphs, backend: str) -> dict[str, str]:
    g = graphs[backend]
    seeds = torch.from_numpy(np.random.default_rng(40).choice(g.num_nodes, 64, replace=False))
    spread = torch.from_numpy(np.random.default_rng(41).integers(500, 1001, len(seeds)))
    out = {}
    for name, (options, fanout, when) in CASES.items():
        sampler = NeighborSampler(g.data, fanout, seed=9, **options)
        times = None if when is None else spread if when == "spread" else torch.full((len(seeds),), when)
        out[name] = _digest(sampler.sample_from_nodes(NodeSamplerInput(None, seeds, times)))
    return out


@pytest.mark.parametrize("backend", ["data", "dataset1", "dataset3"])
def test_every_variant_draws_the_samples_it_drew_before(graphs, backend):
    got = _digests(graphs, backend)
    assert got == DIGESTS[backend], {k: v for k, v in got.items() if DIGESTS[backend].get(k) != v}


def _hubs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two hubs of more than 64 in-edges (beyond the bit mask of short segments): node 0's 300 weights spread,
    node 1's 200 with five edges holding nearly all the weight (repeats, then the draws from what is left)."""
    rng = np.random.default_rng(5)
    dst = np.repeat([0, 1], [300, 200])
    src = np.concatenate([rng.permutation(np.arange(2, 302)), rng.permutation(np.arange(2, 202))])
    weight = np.concatenate([rng.random(300) + 0.05, np.full(200, 1e-3)])
    weight[300:305] = 50.0
    return torch.from_numpy(np.stack([src, dst])), torch.from_numpy(weight.astype(np.float32))


def test_weighted_picks_over_long_segments_draw_what_they_drew_before():
    """Weighted picks on nodes of more than 64 edges read their first k draws in a loop of their own, then drop
    repeats: the samples of testing each draw as it came (digests from before that change)."""
    from torch_geometric.data import Data

    edge_index, weight = _hubs()
    data = Data(edge_index=edge_index, num_nodes=302, weight=weight)
    got = {}
    for fanout in (20, 60, 150):
        sampler = NeighborSampler(data, [fanout], seed=11, weight_attr="weight")
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0, 1])))
        assert len(set(zip(out.row.tolist(), out.col.tolist()))) == out.row.numel()  # without replacement
        got[fanout] = _digest(out)
    assert got == {20: "f821edb956e432c2", 60: "b0c0d7b4ebb23c3e", 150: "36b920040750a755"}, got
