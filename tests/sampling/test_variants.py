"""The variant kernel (sampling.variants): statistical and exact checks of weighted, temporal, disjoint
and edge-masked sampling, on every backend, judged from the raw edge list."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from sampling import NeighborSampler
from sampling.multihop import rng_state
from sampling.variants import _weighted, cumulative_weights

BACKENDS = ["data", "dataset1", "dataset3", "pair"]


def _sample(sampler, seeds, times=None):
    times = None if times is None else torch.as_tensor(times)
    return sampler.sample_from_nodes(NodeSamplerInput(None, torch.as_tensor(seeds), times))


def _variant(sampler):
    assert sampler.fast_path is not None and not sampler.fast_path.plain, "the variant kernel serves it"
    return sampler


def test_cumulative_weights_restart_per_destination_and_skip_non_positive():
    indptr = np.array([0, 3, 3, 5])
    weight = np.array([1.0, -2.0, 0.5, np.nan, 4.0])
    assert cumulative_weights(indptr, weight).tolist() == [1.0, 1.0, 1.5, 0.0, 4.0]


def test_weighted_draws_without_replacement_are_successive_draws():
    """k=2 of weights 1..4 without replacement: P({i, j}) = w_i/W * w_j/(W - w_i) + (i <-> j)."""
    w = np.arange(1.0, 5.0)
    cum, total, state = np.cumsum(w), w.sum(), rng_state(7)
    out, counts = np.empty(2, np.int64), {}
    for _ in range(20000):
        assert _weighted(state, cum, 0, 4, 2, False, out, 0) == 2
        assert out[0] != out[1]
        key = tuple(sorted(out.tolist()))
        counts[key] = counts.get(key, 0) + 1
    pairs = list(itertools.combinations(range(4), 2))
    expected = [w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j]) for i, j in pairs]
    observed = [counts.get(p, 0) for p in pairs]
    assert chisquare(observed, np.array(expected) * sum(observed)).pvalue > 1e-3, (observed, expected)


def test_weighted_without_replacement_never_draws_a_zero_weight_edge():
    """Fewer positive-weight edges than the fanout: exactly those, each once (the exact fallback)."""
    src, dst = torch.tensor([1, 2, 3, 4, 5]), torch.zeros(5, dtype=torch.long)
    data = Data(edge_index=torch.stack([src, dst]), num_nodes=6, weight=torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0]))
    sampler = _variant(NeighborSampler(data, [4], weight_attr="weight", seed=1))
    for _ in range(50):
        assert sorted(_sample(sampler, [0]).edge.tolist()) == [2, 3, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_weighted_single_draws_follow_the_weights_without_replacement(graphs, backend):
    g = graphs[backend]
    star = int(np.flatnonzero(g.to_input == 0)[0])
    sampler = _variant(NeighborSampler(g.data, [1], weight_attr="weight", seed=4))
    eid = np.concatenate([_sample(sampler, [star] * 50).edge.numpy() for _ in range(80)])
    assert len(eid) == 4000, "one edge per seed"
    eid = eid[eid >= len(g.src) - 40]  # the star's weights 1..4 (node 0 has a few random in-edges too)
    by_weight = np.bincount(g.weight[eid].astype(int), minlength=5)[1:]
    assert by_weight.sum() > 3000 and chisquare(by_weight, np.arange(1, 5) / 10 * by_weight.sum()).pvalue > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attr", ["edge_time", "time"])
@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_temporal_picks_never_pass_their_seed_time(graphs, backend, attr, strategy):
    g = graphs[backend]
    name = attr if backend == "data" or attr == "time" else "edge_time"
    rng = np.random.default_rng(30)
    seeds = rng.choice(g.num_nodes, 60, replace=False)
    times = rng.integers(100, 900, len(seeds))
    sampler = _variant(NeighborSampler(g.data, [4, 3, 2], time_attr=name, temporal_strategy=strategy, seed=5))
    out = _sample(sampler, seeds, times)
    node, row, col, eid, batch = (t.numpy() for t in (out.node, out.row, out.col, out.edge, out.batch))
    assert np.array_equal(node[row], g.src[eid]) and np.array_equal(node[col], g.dst[eid])
    when = g.edge_time[eid] if attr == "edge_time" else g.node_time[g.src[eid]]
    assert len(eid) > 100 and (when <= times[batch[col]]).all(), "an edge later than its subgraph's seed time"


@pytest.mark.parametrize("backend", BACKENDS)
def test_temporal_last_takes_the_latest_edges_at_every_hop(graphs, backend):
    g = graphs[backend]
    rng = np.random.default_rng(31)
    seeds = rng.choice(g.num_nodes, 40, replace=False)
    times = rng.integers(300, 1000, len(seeds))
    k = 2
    out = _sample(_variant(NeighborSampler(g.data, [k, k], time_attr="edge_time", temporal_strategy="last")),
                  seeds, times)
    node, col, eid, batch = out.node.numpy(), out.col.numpy(), out.edge.numpy(), out.batch.numpy()
    checked = 0
    for dst_local in np.unique(col):
        v, t = node[dst_local], times[batch[dst_local]]
        eligible = np.flatnonzero((g.dst == v) & (g.edge_time <= t))
        mine = eid[col == dst_local]
        assert sorted(g.edge_time[mine].tolist()) == sorted(g.edge_time[eligible].tolist())[-k:], (v, t)
        checked += 1
    assert checked > 40, "both hops expanded nodes"


@pytest.mark.parametrize("backend", BACKENDS)
def test_disjoint_subgraphs_never_share_nodes(graphs, backend):
    g = graphs[backend]
    seeds = np.random.default_rng(32).choice(g.num_nodes, 50, replace=False)
    seeds[1] = seeds[0]  # a repeated seed still gets its own subgraph
    out = _sample(_variant(NeighborSampler(g.data, [4, 3], disjoint=True, seed=6)), seeds)
    node, row, col, eid, batch = (t.numpy() for t in (out.node, out.row, out.col, out.edge, out.batch))
    assert np.array_equal(node[row], g.src[eid]) and np.array_equal(node[col], g.dst[eid])
    assert np.array_equal(batch[:50], np.arange(50)) and np.array_equal(node[:50], seeds)
    assert np.array_equal(batch[row], batch[col]), "an edge crosses two subgraphs"
    pairs = set(zip(batch.tolist(), node.tolist()))
    assert len(pairs) == len(node), "a node appears twice in one subgraph"
    shared = sum(len(set(node[batch == 0]) & set(node[batch == i])) for i in range(2, 50))
    assert shared > 0 or len(node) < 200, "copies of a node in several subgraphs are kept apart, not merged"


def test_every_variant_combined_in_one_call(graphs):
    """Weighted + temporal + disjoint + replace: times respected, weights positive, subgraphs apart."""
    g = graphs["dataset3"]
    rng = np.random.default_rng(33)
    seeds = rng.choice(g.num_nodes, 30, replace=False)
    times = rng.integers(300, 1000, len(seeds))
    sampler = _variant(NeighborSampler(g.data, [5, 5], weight_attr="weight", time_attr="edge_time", replace=True,
                                       disjoint=True, seed=8))
    out = _sample(sampler, seeds, times)
    node, row, col, eid, batch = (t.numpy() for t in (out.node, out.row, out.col, out.edge, out.batch))
    assert np.array_equal(node[row], g.src[eid]) and np.array_equal(node[col], g.dst[eid])
    assert (g.edge_time[eid] <= times[batch[col]]).all() and np.array_equal(batch[row], batch[col])
    first = slice(0, out.num_sampled_edges[0])
    eligible = np.array([np.count_nonzero((g.dst == s) & (g.edge_time <= t)) for s, t in zip(seeds, times)])
    counts = np.bincount(col[first], minlength=30)[:30]
    assert np.array_equal(counts, np.where(eligible > 0, 5, 0)), "with replacement: k draws wherever one is eligible"
