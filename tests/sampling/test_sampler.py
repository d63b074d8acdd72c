"""The sampler contract, run against every backend: in-memory Data, datasets (1 and 3 partitions), a pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.sampler import NodeSamplerInput

from graphstore.errors import InvalidInputError
from sampling import NeighborSampler
from sampling.drivers.batch_driver import FastPath

BACKENDS = ["data", "dataset1", "dataset3", "pair"]


def _sample(sampler, seeds, times=None):
    seeds = torch.as_tensor(seeds)
    return sampler.sample_from_nodes(NodeSamplerInput(None, seeds, None if times is None else torch.as_tensor(times)))


def _hops(out):
    """Edge index ranges of each hop."""
    bounds = np.cumsum([0, *out.num_sampled_edges])
    return [slice(bounds[i], bounds[i + 1]) for i in range(len(out.num_sampled_edges))]


# Homogeneous uniform sampling over local blocks takes the one-call kernel (FastPath); the contract
# suite runs it in each of its modes and also forces the general per-hop path on the same graphs.
PATHS = [(b, "fast") for b in BACKENDS] + [(b, "general") for b in BACKENDS] + [
    ("dataset3", "fast-unpacked"), ("dataset3", "fast-hash")]


@pytest.fixture(params=PATHS, ids=[f"{b}-{p}" for b, p in PATHS])
def g(request, graphs, monkeypatch):
    backend, path = request.param
    if path != "fast":
        monkeypatch.setattr(NeighborSampler, "fast_path", property(lambda self: _forced_path(self, path)))
    return graphs[backend]


def _forced_path(sampler, path):
    if path == "general" or sampler.is_hetero or sampler.disjoint or sampler.config.weight_attr:
        return None
    if sampler._fast_path is False:
        options = {"packed": False} if path == "fast-unpacked" else {"dense_max_nodes": 0}
        sampler._fast_path = FastPath(sampler.topology[None], sampler.num_nodes, sampler._fanouts,
                                      sampler.config.replace, **options)
    return sampler._fast_path


def _seeds(g, k=40, seed=0):
    return np.random.default_rng(seed).choice(g.num_nodes, k, replace=False)


def test_every_sampled_edge_exists_and_ids_map_back(g):
    out = _sample(NeighborSampler(g.data, [5, 3], seed=1), _seeds(g))
    node, row, col, eid = out.node.numpy(), out.row.numpy(), out.col.numpy(), out.edge.numpy()
    assert len(row) == len(col) == len(eid) == sum(out.num_sampled_edges) > 0
    assert np.array_equal(node[row], g.src[eid]) and np.array_equal(node[col], g.dst[eid])
    assert len(np.unique(node)) == len(node), "nodes are de-duplicated"
    assert out.num_sampled_nodes[0] == 40 and sum(out.num_sampled_nodes) == len(node)


def test_fanout_bounds_and_no_repeats_without_replacement(g):
    out = _sample(NeighborSampler(g.data, [4, 2], seed=2), _seeds(g, 60))
    col, eid = out.col.numpy(), out.edge.numpy()
    for hop, fanout in zip(_hops(out), [4, 2]):
        counts = np.bincount(col[hop])
        assert counts.max() <= fanout
        pairs = col[hop] * (eid.max() + 1) + eid[hop]
        assert len(np.unique(pairs)) == len(pairs), "an edge was drawn twice for one node"
        for d in np.unique(col[hop]):  # a node with fewer neighbours than the fanout gets them all
            deg = np.count_nonzero(g.dst == out.node[d].item())
            assert counts[d] == min(deg, fanout)


def test_replacement_draws_exactly_fanout(g):
    out = _sample(NeighborSampler(g.data, [7], replace=True, seed=3), _seeds(g, 30))
    counts = np.bincount(out.col.numpy(), minlength=30)[:30]
    deg = np.array([np.count_nonzero(g.dst == s) for s in out.node[:30].numpy()])
    assert np.array_equal(counts, np.where(deg > 0, 7, 0))


def test_full_fanout_is_the_exact_two_hop_neighbourhood(g):
    seeds = _seeds(g, 10, seed=4)
    out = _sample(NeighborSampler(g.data, [-1, -1]), seeds)
    eid, hops = out.edge.numpy(), _hops(out)
    hop1 = np.flatnonzero(np.isin(g.dst, seeds))
    assert set(eid[hops[0]]) == set(hop1)
    frontier = np.setdiff1d(g.src[hop1], seeds)
    hop2 = np.flatnonzero(np.isin(g.dst, frontier))
    assert set(eid[hops[1]]) == set(hop2)
    assert set(out.node.numpy()) == set(seeds) | set(g.src[hop1]) | set(g.src[hop2])


def test_partitioned_equals_unpartitioned_with_full_fanout(graphs):
    """The oracle: sampling a 3-partition dataset equals sampling the unpartitioned graph."""
    whole, parts = graphs["data"], graphs["dataset3"]
    seeds_input = np.arange(0, 400, 37)
    from_input = np.empty(400, np.int64)
    from_input[parts.to_input] = np.arange(400)
    a = _sample(NeighborSampler(whole.data, [-1, -1, -1]), seeds_input)
    b = _sample(NeighborSampler(parts.data, [-1, -1, -1]), from_input[seeds_input])
    assert set(a.node.numpy()) == set(parts.to_input[b.node.numpy()])
    assert a.num_sampled_edges == b.num_sampled_edges
    for ha, hb in zip(_hops(a), _hops(b)):
        assert set(a.edge.numpy()[ha]) == set(b.edge.numpy()[hb])


def test_uniform_sampling_is_uniform(graphs):
    g = graphs["dataset3"]
    star = g.to_input.tolist().index(0)  # input node 0 has 40 distinct in-neighbours (plus random ones)
    sampler = NeighborSampler(g.data, [5], seed=5)
    counts = {}
    for _ in range(600):
        for e in _sample(sampler, [star]).edge.numpy():
            counts[e] = counts.get(e, 0) + 1
    observed = np.array(list(counts.values()))
    assert len(observed) == np.count_nonzero(g.dst == star)
    assert chisquare(observed).pvalue > 1e-3


def test_weighted_sampling_follows_the_weights(graphs):
    g = graphs["data"]
    star_edges = np.arange(len(g.src) - 40, len(g.src))  # weights 1, 2, 3, 4 repeated
    sampler = NeighborSampler(g.data, [200], replace=True, weight_attr="weight", seed=6)
    eid = np.concatenate([_sample(sampler, [0]).edge.numpy() for _ in range(100)])
    eid = eid[np.isin(eid, star_edges)]
    by_weight = np.bincount(g.weight[eid].astype(int), minlength=5)[1:]
    expected = np.arange(1, 5) / 10 * by_weight.sum()
    assert chisquare(by_weight, expected).pvalue > 1e-3
    without = NeighborSampler(g.data, [3], weight_attr="weight", seed=7)
    picks = np.concatenate([_sample(without, [0]).edge.numpy() for _ in range(300)])
    picks = picks[np.isin(picks, star_edges)]
    light, heavy = (np.count_nonzero(g.weight[picks] == w) for w in (1, 4))
    assert heavy > 2 * light


@pytest.mark.parametrize("attr", ["time", "edge_time"])
def test_temporal_sampling_never_looks_into_the_future(g, attr):
    seeds = _seeds(g, 50, seed=8)
    limit = np.full(50, 500)
    sampler = NeighborSampler(g.data, [6, 6], time_attr=attr, seed=9)
    out = _sample(sampler, seeds, limit)
    assert out.batch is not None, "temporal sampling is disjoint"
    eid, node = out.edge.numpy(), out.node.numpy()
    if attr == "time":
        assert (g.node_time[node[len(seeds):]] <= 500).all()
    else:
        assert (g.edge_time[eid] <= 500).all()
    assert len(eid) > 0


def test_temporal_strategy_last_takes_the_latest(graphs):
    g = graphs["data"]
    out = _sample(NeighborSampler(g.data, [2], time_attr="edge_time", temporal_strategy="last"), [0], [10**6])
    star_times = np.sort(g.edge_time[g.dst == 0])[::-1]
    assert sorted(g.edge_time[out.edge.numpy()], reverse=True) == list(star_times[:2])


def test_disjoint_subgraphs_stay_apart(g):
    seeds = _seeds(g, 8, seed=10)
    out = _sample(NeighborSampler(g.data, [3, 3], disjoint=True, seed=11), seeds)
    batch, row, col = out.batch.numpy(), out.row.numpy(), out.col.numpy()
    assert np.array_equal(batch[:8], np.arange(8))
    assert np.array_equal(batch[row], batch[col]), "an edge crosses two subgraphs"


def test_bad_arguments_are_named(graphs):
    g = graphs["data"]
    with pytest.raises(InvalidInputError, match="num_neighbors"):
        NeighborSampler(g.data, [5, "x"])
    with pytest.raises(InvalidInputError, match="temporal_strategy"):
        NeighborSampler(g.data, [5], temporal_strategy="future")
    with pytest.raises(InvalidInputError, match="time_attr 'nope'"):
        NeighborSampler(g.data, [5], time_attr="nope")
    with pytest.raises(InvalidInputError, match="weight_attr 'nope'"):
        NeighborSampler(g.data, [5], weight_attr="nope")


def test_sampler_pickles_small_for_datasets(graphs):
    import pickle

    sampler = NeighborSampler(graphs["dataset3"].data, [3])
    _sample(sampler, [1, 2])
    clone = pickle.loads(pickle.dumps(sampler))
    assert len(pickle.dumps(sampler)) < 50_000
    a, b = _sample(NeighborSampler(graphs["dataset3"].data, [-1]), [1, 2]), _sample(clone, [1, 2])
    assert set(a.edge.numpy()) <= set(np.flatnonzero(np.isin(graphs["dataset3"].dst, [1, 2])))
    assert len(b.edge) <= len(a.edge)
