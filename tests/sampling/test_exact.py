"""Exact sampling oracles computed from the raw edge list alone (never from our own sampler):
disjoint and temporal neighbourhoods, weighted draws, a pickled sampler, distributed sampling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.sampler import NodeSamplerInput

from sampling import NeighborSampler
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import DistributedSampler
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport
from tests.sampling.test_sampler import _hops, _sample, g  # noqa: F401  (g: the per-backend fixture)


def oracle_hops(src: np.ndarray, dst: np.ndarray, seeds, hops: int, keep: np.ndarray | None = None
                ) -> tuple[list[np.ndarray], set]:
    """Edge IDs per hop of the full (fanout -1) neighbourhood of ``seeds`` in the raw edge list, each
    hop expanding only nodes first reached in the previous one; ``keep`` masks edges allowed.
    Returns (sorted edge IDs per hop, every node reached)."""
    keep = np.ones(len(src), bool) if keep is None else keep
    seen, frontier, out = set(int(s) for s in seeds), np.unique(np.asarray(seeds)), []
    for _ in range(hops):
        edges = np.flatnonzero(np.isin(dst, frontier) & keep)
        out.append(np.sort(edges))
        new = set(src[edges].tolist()) - seen
        seen |= new
        frontier = np.array(sorted(new), dtype=np.int64)
    return out, seen


def _with_in_edges(g, k: int, seed: int) -> np.ndarray:
    has = np.unique(g.dst)
    return np.random.default_rng(seed).choice(has, k, replace=False)


def _check_ids(g, out) -> None:
    node, row, col, eid = out.node.numpy(), out.row.numpy(), out.col.numpy(), out.edge.numpy()
    assert np.array_equal(node[row], g.src[eid]) and np.array_equal(node[col], g.dst[eid])


def _per_subgraph(out, i: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Subgraph ``i`` of a disjoint output: its edge IDs per hop (sorted) and its nodes."""
    batch, col, eid = out.batch.numpy(), out.col.numpy(), out.edge.numpy()
    hops = [np.sort(eid[h][batch[col[h]] == i]) for h in _hops(out)]
    return hops, out.node.numpy()[batch == i]


def test_disjoint_full_fanout_subgraph_i_is_seed_i_two_hop_neighbourhood(g):
    seeds = _with_in_edges(g, 8, seed=20)
    out = _sample(NeighborSampler(g.data, [-1, -1], disjoint=True), seeds)
    _check_ids(g, out)
    batch, row, col = out.batch.numpy(), out.row.numpy(), out.col.numpy()
    assert np.array_equal(batch[row], batch[col]), "an edge crosses two subgraphs"
    for i, s in enumerate(seeds):
        want, reached = oracle_hops(g.src, g.dst, [s], 2)
        got, nodes = _per_subgraph(out, i)
        assert len(want[0]) > 0 and len(got[0]) > 0, f"subgraph {i} is empty"
        assert [h.tolist() for h in got] == [h.tolist() for h in want], f"subgraph {i} (seed {s})"
        assert sorted(nodes.tolist()) == sorted(reached), f"nodes of subgraph {i} (each once)"


@pytest.mark.parametrize("attr", ["edge_time", "time"])
def test_temporal_full_fanout_each_seed_at_its_own_time(g, attr):
    rng = np.random.default_rng(21)
    seeds = _with_in_edges(g, 30, seed=22)
    times = rng.integers(0, 1000, len(seeds))
    out = _sample(NeighborSampler(g.data, [-1, -1], time_attr=attr), seeds, times)
    _check_ids(g, out)
    edge_time = g.edge_time if attr == "edge_time" else g.node_time[g.src]  # node time: the neighbour's
    nonempty = 0
    for i, (s, t) in enumerate(zip(seeds, times)):
        want, reached = oracle_hops(g.src, g.dst, [s], 2, keep=edge_time <= t)
        got, nodes = _per_subgraph(out, i)
        assert [h.tolist() for h in got] == [h.tolist() for h in want], f"seed {s} at time {t}"
        assert sorted(nodes.tolist()) == sorted(reached)
        nonempty += len(want[0]) > 0
    assert nonempty >= 10, "too few seeds had an edge early enough: the test would prove little"


def test_temporal_strategy_last_takes_each_seeds_latest_k(g):
    rng = np.random.default_rng(23)
    seeds = _with_in_edges(g, 30, seed=24)
    times = rng.integers(200, 1000, len(seeds))
    k = 3
    out = _sample(NeighborSampler(g.data, [k], time_attr="edge_time", temporal_strategy="last"), seeds, times)
    _check_ids(g, out)
    for i, (s, t) in enumerate(zip(seeds, times)):
        eligible = np.flatnonzero((g.dst == s) & (g.edge_time <= t))
        (got,), _ = _per_subgraph(out, i)
        assert set(got.tolist()) <= set(eligible.tolist()), f"seed {s}: an edge later than {t} or not its own"
        assert sorted(g.edge_time[got].tolist()) == sorted(g.edge_time[eligible].tolist())[-k:], f"seed {s}"


def _weighted_counts(g, sample) -> tuple[np.ndarray, np.ndarray]:
    """Draws on the star (input node 0: 40 in-edges of weights 1..4): counts by weight, expected."""
    star_edges = np.arange(len(g.src) - 40, len(g.src))  # weights 1, 2, 3, 4 repeated
    eid = np.concatenate([sample() for _ in range(100)])
    eid = eid[np.isin(eid, star_edges)]
    by_weight = np.bincount(g.weight[eid].astype(int), minlength=5)[1:]
    return by_weight, np.arange(1, 5) / 10 * by_weight.sum()


@pytest.mark.parametrize("backend", ["data", "dataset1", "dataset3", "pair"])
def test_weighted_sampling_follows_the_weights_on_every_backend(graphs, backend):
    g = graphs[backend]
    star = int(np.flatnonzero(g.to_input == 0)[0])
    sampler = NeighborSampler(g.data, [200], replace=True, weight_attr="weight", seed=6)
    by_weight, expected = _weighted_counts(g, lambda: _sample(sampler, [star]).edge.numpy())
    assert by_weight.sum() > 5000 and chisquare(by_weight, expected).pvalue > 1e-3, by_weight


def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


def test_weighted_distributed_sampling_follows_the_weights(graphs):
    g = graphs["dataset3"]
    ds = g.data
    star = int(np.flatnonzero(g.to_input == 0)[0])
    owner = int(ds.owner(np.array([star]))[0])
    rank = (owner + 1) % 3  # a rank that does not own the star: its draws are made by the owner's server
    transports = _group(ds)
    sampler = DistributedSampler(ds, [200], transports[rank], RankLayout(3, 3), replace=True, weight_attr="weight",
                                 seed=6)
    by_weight, expected = _weighted_counts(
        g, lambda: sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([star]))).edge.numpy())
    assert transports[rank].calls == 100, "every draw was remote"
    assert by_weight.sum() > 5000 and chisquare(by_weight, expected).pvalue > 1e-3, by_weight


@pytest.mark.parametrize("backend", ["data", "dataset3", "pair"])
def test_a_pickled_sampler_samples_exactly(graphs, backend):
    g = graphs[backend]
    seeds = _with_in_edges(g, 12, seed=25)
    for fanout in ([-1, -1], [3, 2]):
        original = NeighborSampler(g.data, fanout, seed=3)
        _sample(original, seeds[:2])  # used before pickling: topology and kernels loaded
        clone = pickle.loads(pickle.dumps(original))
        out = _sample(clone, seeds)
        _check_ids(g, out)
        if fanout == [-1, -1]:
            want, reached = oracle_hops(g.src, g.dst, seeds, 2)
            got = [np.sort(out.edge.numpy()[h]) for h in _hops(out)]
            assert [h.tolist() for h in got] == [h.tolist() for h in want]
            assert sorted(out.node.tolist()) == sorted(reached)
        else:
            first = _hops(out)[0]
            counts = np.bincount(out.col.numpy()[first], minlength=len(seeds))[: len(seeds)]
            degree = np.array([np.count_nonzero(g.dst == s) for s in seeds])
            assert np.array_equal(counts, np.minimum(degree, 3))
            assert len(np.unique(out.edge.numpy()[first])) == len(out.edge.numpy()[first]), "an edge drawn twice"


def test_distributed_full_fanout_is_the_raw_neighbourhood(graphs):
    g = graphs["dataset3"]
    ds = g.data
    layout = RankLayout(3, 3)
    for rank, transport in enumerate(_group(ds)):
        lo, hi = ds.node_offsets()[rank: rank + 2]
        seeds = np.arange(lo, min(hi, lo + 15))
        out = DistributedSampler(ds, [-1, -1, -1], transport, layout).sample_from_nodes(
            NodeSamplerInput(None, torch.from_numpy(seeds)))
        _check_ids(g, out)
        want, reached = oracle_hops(g.src, g.dst, seeds, 3)
        got = [np.sort(out.edge.numpy()[h]) for h in _hops(out)]
        assert [h.tolist() for h in got] == [h.tolist() for h in want], f"rank {rank}"
        assert sorted(out.node.tolist()) == sorted(reached)
        assert transport.calls > 0


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_distributed_temporal_sampling_each_seed_at_its_own_time(graphs, strategy):
    g = graphs["dataset3"]
    ds = g.data
    rng = np.random.default_rng(26)
    fanout = [-1, -1] if strategy == "uniform" else [2, 2]
    for rank, transport in enumerate(_group(ds)):
        lo, hi = ds.node_offsets()[rank: rank + 2]
        seeds = np.arange(lo, min(hi, lo + 20))
        times = rng.integers(200, 1000, len(seeds))
        sampler = DistributedSampler(ds, fanout, transport, RankLayout(3, 3), time_attr="edge_time",
                                     temporal_strategy=strategy)
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.from_numpy(seeds), torch.from_numpy(times)))
        _check_ids(g, out)
        for i, (s, t) in enumerate(zip(seeds, times)):
            got, nodes = _per_subgraph(out, i)
            if strategy == "uniform":
                want, reached = oracle_hops(g.src, g.dst, [s], 2, keep=g.edge_time <= t)
                assert [h.tolist() for h in got] == [h.tolist() for h in want], f"rank {rank}, seed {s} at {t}"
                assert sorted(nodes.tolist()) == sorted(reached)
            else:  # each expanded node's latest 2 edges no later than the seed's time
                expanded = [np.array([s])] + [np.setdiff1d(g.src[got[0]], [s])]
                for hop, frontier in zip(got, expanded):
                    for v in frontier:
                        eligible = np.flatnonzero((g.dst == v) & (g.edge_time <= t))
                        mine = hop[g.dst[hop] == v]
                        assert set(mine.tolist()) <= set(eligible.tolist()), f"seed {s}, node {v}"
                        assert sorted(g.edge_time[mine].tolist()) == sorted(g.edge_time[eligible].tolist())[-2:]
        assert transport.calls > 0, "the second hop reached other partitions"
