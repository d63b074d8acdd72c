"""The variant kernel (sampling.kernels.hop_kernel): statistical and exact checks of weighted, temporal, disjoint
and edge-masked sampling, on every backend, judged from the raw edge list."""

from __future__ import annotations

import itertools

import numpy as np
from numba import njit
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from sampling import NeighborSampler
from sampling.kernels.rng import rng_state
from sampling.kernels.draws import draw_weighted, cumulative_weights

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
        assert draw_weighted(state, cum, 0, 4, 2, False, out, 0) == 2
        assert out[0] != out[1]
        key = tuple(sorted(out.tolist()))
        counts[key] = counts.get(key, 0) + 1
    pairs = list(itertools.combinations(range(4), 2))
    expected = [w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j]) for i, j in pairs]
    observed = [counts.get(p, 0) for p in pairs]
    assert chisquare(observed, np.array(expected) * sum(observed)).pvalue > 1e-3, (observed, expected)


@pytest.mark.parametrize("bits", [0, 3])
def test_the_alias_rest_draws_successively_from_the_alias_tables_shares(bits):
    """When the redraws run out, the rest is drawn from the node's alias entries (both layouts): after a
    given first pick (3), two more of weights 1, 0, 2, 4, 3 come in successive draws ∝ weight; the zero
    weight never does."""
    from sampling.graph import derived
    from sampling.kernels.draws import _alias_rest

    w = np.array([1.0, 0.0, 2.0, 4.0, 3.0])
    alias = derived.alias_table(np.array([0, 5]), w)
    packed = np.zeros(10, np.int32)
    table, astride, amask = (alias, 2, 0) if not bits else (
        derived.compact_weighted_packed(packed, alias, bits)[2:], 3, (1 << bits) - 1)
    state, out, counts = rng_state(3), np.empty(3, np.int64), {}
    cum = np.full(8, np.nan)  # scratch, larger than the node
    for _ in range(20000):
        out[0] = 3
        assert _alias_rest(state, table, astride, amask, 0, 5, 3, out, 0, 1, cum) == 3
        counts[tuple(out[1:].tolist())] = counts.get(tuple(out[1:].tolist()), 0) + 1
    left = w.sum() - w[3]
    pairs = [(i, j) for i in (0, 2, 4) for j in (0, 2, 4) if i != j]
    expected = np.array([w[i] / left * w[j] / (left - w[i]) for i, j in pairs])
    observed = [counts.get(p, 0) for p in pairs]
    assert sum(observed) == 20000, counts  # never the zero weight, never the first pick again
    assert chisquare(observed, expected * 20000).pvalue > 1e-3, (observed, expected * 20000)
    out[0] = 3
    assert _alias_rest(state, table, astride, amask, 0, 5, 3 + 2, out_all := np.empty(5, np.int64), 0, 0, cum) == 4
    assert sorted(out_all[:4].tolist()) == [0, 2, 3, 4], "fewer positive weights than k: each once"


def test_weighted_picks_whose_redraws_run_out_follow_the_weights():
    """A node whose heaviest edge takes nearly every redraw (weights 1000, 1, 2, 3, fanout 3): the picks
    come from the alias rest, and the left-out edge is each light one as often as successive draws say."""
    src, dst = torch.tensor([1, 2, 3, 4]), torch.zeros(4, dtype=torch.long)
    w = np.array([1000.0, 1.0, 2.0, 3.0])
    data = Data(edge_index=torch.stack([src, dst]), num_nodes=5, weight=torch.from_numpy(w))
    sampler = _variant(NeighborSampler(data, [3], weight_attr="weight", seed=2))
    left_out = np.zeros(4, np.int64)
    for _ in range(40):
        edges = _sample(sampler, [0] * 50).edge.numpy().reshape(50, 3)
        assert (edges[:, 0] == 0).mean() > 0.9 and (np.sort(edges, 1)[:, 1] > 0).all()
        left_out += np.bincount([6 - row.sum() for row in edges], minlength=4)
    # the heavy edge is (almost surely) first; of the light ones, the two drawn next are successive
    light = w[1:] / w[1:].sum()
    p_out = [sum(light[a] * light[b] / (1 - light[a]) for a in range(3) for b in range(3)
                 if len({a, b, c}) == 3) for c in range(3)]
    assert left_out[0] == 0 and chisquare(left_out[1:], np.array(p_out) * 2000).pvalue > 1e-3, left_out


def test_weighted_without_replacement_never_draws_a_zero_weight_edge():
    """Fewer positive-weight edges than the fanout: exactly those, each once (the exact fallback)."""
    src, dst = torch.tensor([1, 2, 3, 4, 5]), torch.zeros(5, dtype=torch.long)
    data = Data(edge_index=torch.stack([src, dst]), num_nodes=6, weight=torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0]))
    sampler = _variant(NeighborSampler(data, [4], weight_attr="weight", seed=1))
    for _ in range(50):
        assert sorted(_sample(sampler, [0]).edge.tolist()) == [2, 3, 4]


def test_compact_weighted_records_keep_every_offset_and_mark_weightless_destinations():
    """12-byte records: the alias offset in the low bits, the threshold above them (a kept column keeps at
    least 2**bits), a destination without a positive weight all offset bits set and no threshold."""
    from sampling.graph import derived

    indptr = np.array([0, 3, 3, 6, 8])
    weight = np.array([1.0, 2.0, 3.0, 0.0, 1e-12, 5.0, 0.0, np.nan])
    alias = derived.alias_table(indptr, weight)
    packed = np.arange(16, dtype=np.int32)
    bits = 2  # the largest degree, 3, fits: offsets 0..2, and 3 (all set) is the mark
    code = derived.compact_weighted_packed(packed, alias, bits)[2::3].view(np.uint32)
    assert derived.compact_weighted_packed(packed, alias, bits)[0::3].tolist() == packed[0::2].tolist()
    threshold, offset = code & ~np.uint32(3), code & np.uint32(3)
    drawable = alias[0::2] != 0
    assert (offset[:6] == alias[1:12:2]).all() and (offset[6:] == 3).all() and (threshold[6:] == 0).all()
    assert (threshold[drawable] >= 4).all() and (threshold[~drawable] == 0).all()
    assert drawable[4], "a tiny positive weight stays drawable"
    assert (np.abs(threshold.astype(np.int64) - alias[0::2].astype(np.int64))[drawable] < 4).all()


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_the_split_first_copy_puts_each_destinations_admitted_edges_first_in_csc_order(chunk):
    """Built a run of destinations at a time (``chunk`` edges, a hub alone past it): per destination its
    admitted edges, then the others, each part in CSC order, with the pairs alongside, whatever the runs."""
    from sampling.graph import derived

    rng = np.random.default_rng(5)
    deg = rng.integers(0, 6, 40)
    deg[[3, 17]] = 0, 30  # an empty destination and a hub longer than the small runs
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    edges = int(indptr[-1])
    split = rng.integers(0, 3, edges).astype(np.int8)
    packed = rng.integers(0, 1 << 30, 2 * edges).astype(np.int32)
    pairs, order, counts = np.full(2 * edges, -1, np.int32), np.full(edges, -1, np.int32), np.full(40, -1, np.int32)
    derived.split_records(indptr, split, np.int64(0b101), packed, pairs, order, counts, chunk=chunk)
    want = []
    for v in range(40):
        span = range(indptr[v], indptr[v + 1])
        admitted = [p for p in span if split[p] in (0, 2)]
        want += admitted + [p for p in span if split[p] == 1]
        assert counts[v] == len(admitted)
    assert order.tolist() == want
    assert (pairs.reshape(-1, 2) == packed.reshape(-1, 2)[want]).all()


def test_the_compact_weighted_layout_draws_what_the_full_one_draws(monkeypatch):
    """Where every degree fits the offset bits the packed weighted layout is 12 bytes an edge, else 16; the
    same seeds draw the same edges in both, zero weights never, a weightless destination nothing."""
    from sampling.graph import derived

    rng = np.random.default_rng(12)
    src, dst = rng.integers(0, 300, 6000), rng.integers(0, 299, 6000)
    weight = rng.random(6000) * (rng.random(6000) > 0.2)  # a fifth of the edges weigh nothing
    src, dst = np.append(src, [1, 2, 3]), np.append(dst, [299, 299, 299])
    weight = np.append(weight, [0.0, 0.0, 0.0])  # node 299: in-edges, none with weight
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=300, weight=torch.from_numpy(weight))
    seeds = np.append(rng.choice(299, 60, replace=False), 299)
    outs = {}
    for bits in (derived.COMPACT_ALIAS_BITS, 0):
        monkeypatch.setattr(derived, "COMPACT_ALIAS_BITS", bits)
        sampler = _variant(NeighborSampler(data, [6, 4, 3], weight_attr="weight", seed=9))
        assert sampler.fast_path.blocks.astride == (3 if bits else 4)
        outs[bits] = [_sample(sampler, seeds) for _ in range(3)]
    for compact, full in zip(*outs.values()):
        for name in ("node", "row", "col", "edge"):
            assert torch.equal(getattr(compact, name), getattr(full, name)), name
        eid = compact.edge.numpy()
        assert len(eid) > 500 and (weight[eid] > 0).all()
        assert not (dst[eid] == 299).any()


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


def test_disjoint_maps_stay_apart_when_their_tags_wrap():
    """Each (hop, subgraph) tags its entries in one reused table; after 2**22 - 1 tags the table is
    zeroed, else an entry left by the first subgraph would answer for the one that reuses its tag.
    Node 0 has a self-loop, node 1 an edge from node 2 (other slots of the table); the first seed and
    the one past the wrap are node 0, every other seed is node 1."""
    from sampling.kernels.idmap import _TAGS

    data = Data(edge_index=torch.tensor([[0, 2], [0, 1]]), num_nodes=3)
    seeds = np.ones(_TAGS + 1, np.int64)
    seeds[0] = seeds[_TAGS - 1] = 0
    out = _sample(_variant(NeighborSampler(data, [1], disjoint=True, seed=0)), seeds)
    row, col, batch = (t.numpy() for t in (out.row, out.col, out.batch))
    assert len(row) == len(seeds)
    assert np.array_equal(batch[row], batch[col]), "an edge crosses two subgraphs"
    loops = np.flatnonzero(seeds == 0)
    assert np.array_equal(row[np.isin(col, loops)], loops), "a self-loop comes back to its own seed"


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


def test_alias_draws_without_replacement_are_successive_draws():
    """The sampler's alias-table picks (k=2 of weights 1..4, no replacement) follow successive draws:
    P({i, j}) = w_i/W * w_j/(W - w_i) + (i <-> j); zero, negative and NaN weights are never drawn."""
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0, -1.0, np.nan])
    data = Data(edge_index=torch.stack([torch.arange(1, 8), torch.zeros(7, dtype=torch.long)]), num_nodes=8,
                weight=torch.from_numpy(w))
    sampler = _variant(NeighborSampler(data, [2], weight_attr="weight", seed=9))
    assert sampler.fast_path.blocks.aliases is not None, "unfiltered weighted picks read the alias table"
    eid = _sample(sampler, [0] * 20000).edge.numpy().reshape(-1, 2)
    assert (eid < 4).all() and (eid[:, 0] != eid[:, 1]).all()
    pairs = list(itertools.combinations(range(4), 2))
    keys = np.sort(eid, axis=1) @ np.array([4, 1])
    observed = [int(np.count_nonzero(keys == 4 * i + j)) for i, j in pairs]
    total = w[:4].sum()
    expected = [w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j]) for i, j in pairs]
    assert chisquare(observed, np.array(expected) * sum(observed)).pvalue > 1e-3, (observed, expected)


def test_time_records_order_each_destination_and_break_ties_by_earlier_position():
    from sampling.graph.derived import narrow_times, time_records

    indptr = np.array([0, 4, 4, 7])
    time = np.array([5, 1, 5, 3, 9, 2, 9]) + 10**12
    src, eid = np.arange(100, 107), np.arange(200, 207)
    assert not narrow_times(np.array([0, 2**31])) and narrow_times(time)
    keys, pairs, order = np.empty(7, np.int32), np.empty(14, np.int32), np.empty(7, np.int32)
    base = time_records(indptr, time, src, eid, keys, pairs, order)
    assert base == 10**12 + 1
    assert (keys.astype(np.int64) + base).tolist() == [10**12 + t for t in [1, 3, 5, 5, 2, 9, 9]]
    assert order.tolist() == [1, 3, 2, 0, 5, 6, 4], "equal times: later position first ('last' keeps the earlier)"
    assert pairs[0::2].tolist() == (100 + order).tolist() and pairs[1::2].tolist() == (200 + order).tolist()
    data = Data(edge_index=torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]]), num_nodes=5, time=torch.tensor([7, 7, 7, 1]))
    out = _sample(NeighborSampler(data, [2], time_attr="time", temporal_strategy="last"), [0], [10])
    assert sorted(out.edge.tolist()) == [0, 1], "ties at the cut: the earlier edges, as the scan did"


def test_blocked_time_records_hold_each_destinations_keys_beside_its_pairs():
    """The blocked layout holds the same keys and pairs as the apart one, where key_at/pair_at say: a
    destination's keys at 3 * start, then its pairs."""
    from sampling.graph.derived import key_at, pair_at, time_records

    indptr = np.array([0, 4, 4, 7, 8])
    time = np.array([5, 1, 5, 3, 9, 2, 9, 4]) + 10**12
    src, eid = np.arange(100, 108), np.arange(200, 208)
    keys, pairs, order = np.empty(8, np.int32), np.empty(16, np.int32), np.empty(8, np.int32)
    base = time_records(indptr, time, src, eid, keys, pairs, order)
    records, order2 = np.full(24, -1, np.int32), np.empty(8, np.int32)
    assert time_records(indptr, time, src, eid, records, records, order2, True) == base
    assert order2.tolist() == order.tolist() and (records >= 0).all(), "every slot written once"
    for v in range(len(indptr) - 1):
        start, end = indptr[v], indptr[v + 1]
        assert records[key_at(start, True): key_at(start, True) + end - start].tolist() == keys[start:end].tolist()
        for p in range(start, end):
            at = pair_at(p, end)
            assert (records[at], records[at + 1]) == (pairs[2 * p], pairs[2 * p + 1])
            assert key_at(start, True) <= at < 3 * end  # within the destination's own block


@pytest.mark.parametrize("options", [{}, {"temporal_strategy": "last"}, {"weight_attr": "weight"}])
def test_blocked_and_apart_time_records_sample_the_same_edges(graphs, options):
    """Over the packed pairs the time records are blocked; without them (the int64 arrays) apart. The same
    seeds draw the same edges, positions and nodes either way."""
    from sampling.drivers.batch_driver import FastPath

    g = graphs["data"]
    seeds, times = np.arange(0, 400, 7), np.arange(0, 400, 7) * 3 + 200
    outs = []
    for packed in (True, False):
        sampler = NeighborSampler(g.data, [4, 3], time_attr="edge_time", seed=5, **options)
        fast = sampler.fast_path
        if not packed:
            sampler._fast_path = FastPath(sampler.topology[None], sampler.num_nodes, sampler._fanouts, False,
                                          packed=False, variants=fast.variants)
        assert bool(sampler.fast_path.blocks.tsort.blocked[0]) == packed, "blocked exactly over the packed pairs"
        sampler.fast_path.positions = True  # the CSC positions too (a dataset's edge attributes want them)
        out = sampler.sample_from_nodes(NodeSamplerInput(torch.arange(len(seeds)), torch.as_tensor(seeds),
                                                         torch.as_tensor(times)))
        outs.append((out, out.edge_locator[None]()[1]))
    (a, pos_a), (b, pos_b) = outs
    assert a.row.numel() > 100
    for name in ("node", "row", "col", "edge", "batch"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(pos_a, pos_b)


def _hetero_graph(seed: int = 0):
    from torch_geometric.data import HeteroData

    rng = np.random.default_rng(seed)
    data = HeteroData()
    data["paper"].num_nodes, data["author"].num_nodes = 300, 100
    for et, (s, d) in {("author", "writes", "paper"): (100, 300), ("paper", "cites", "paper"): (300, 300)}.items():
        m = 3000
        data[et].edge_index = torch.from_numpy(np.stack([rng.integers(0, s, m), rng.integers(0, d, m)]))
        data[et].time = torch.from_numpy(rng.integers(0, 1000, m))
        data[et].weight = torch.from_numpy(rng.random(m) + 0.1)
    star = ("author", "writes", "paper")  # paper 0: 40 more authors with weights 1..4
    data[star].edge_index = torch.cat([data[star].edge_index, torch.stack([torch.arange(40), torch.zeros(40).long()])], 1)
    data[star].weight = torch.cat([data[star].weight, torch.from_numpy(np.tile(np.arange(1.0, 5.0), 10))])
    data[star].time = torch.cat([data[star].time, torch.zeros(40, dtype=torch.long)])
    return data


def test_heterogeneous_variants_in_the_per_hop_driver():
    """Weighted (chi-square on a star), temporal (never past the seed time, 'last' the latest) and disjoint
    (no shared (subgraph, node)) sampling of a heterogeneous graph, one kernel call per edge type per hop."""
    data = _hetero_graph()
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    sampler = NeighborSampler(data, [200], replace=True, weight_attr="weight", seed=3)
    assert sampler.fast_path is None
    eid = np.concatenate([sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0]), input_type="paper"))
                          .edge[writes].numpy() for _ in range(60)])
    w = data[writes].weight.numpy()
    star = eid[eid >= 3000]
    by_weight = np.bincount(w[star].astype(int), minlength=5)[1:]
    assert by_weight.sum() > 3000 and chisquare(by_weight, np.arange(1, 5) / 10 * by_weight.sum()).pvalue > 1e-3
    rng = np.random.default_rng(1)
    seeds, times = torch.from_numpy(rng.choice(300, 40, replace=False)), torch.from_numpy(rng.integers(200, 900, 40))
    for strategy in ("uniform", "last"):
        out = NeighborSampler(data, [3, 2], time_attr="time", temporal_strategy=strategy, seed=4).sample_from_nodes(
            NodeSamplerInput(None, seeds, times, input_type="paper"))
        checked = 0
        for et in (writes, cites):
            e, col, batch = out.edge[et].numpy(), out.col[et].numpy(), out.batch[et[2]].numpy()
            assert (data[et].time.numpy()[e] <= times.numpy()[batch[col]]).all(), (strategy, et)
            checked += len(e)
        assert checked > 100
    out = NeighborSampler(data, [4, 3], disjoint=True, seed=5).sample_from_nodes(
        NodeSamplerInput(None, seeds, input_type="paper"))
    for nt in ("paper", "author"):
        pairs = set(zip(out.batch[nt].tolist(), out.node[nt].tolist()))
        assert len(pairs) == len(out.node[nt]), f"a {nt} appears twice in one subgraph"
    for et in (writes, cites):
        assert np.array_equal(out.batch[et[0]][out.row[et]], out.batch[et[2]][out.col[et]]), et


def test_a_datasets_derived_arrays_are_stored_once_and_memory_mapped(graphs, tmp_path, monkeypatch):
    """Alias tables and time-sorted edges of a dataset block go to its cache directory (keyed by the
    manifest) and a later process maps them instead of building them; the samples are the same."""
    import graphstore
    from sampling.graph import derived

    monkeypatch.setattr(derived, "STORE_MIN_BYTES", 0)  # the test graph is far below the threshold
    g = graphs["dataset3"]
    seeds, times = np.arange(0, 400, 9), np.full(45, 600)

    def sample():
        ds = graphstore.open_dataset(g.data.url, cache_dir=tmp_path)
        sampler = NeighborSampler(ds, [3, 2], weight_attr="weight", time_attr="edge_time", seed=2)
        out = _sample(sampler, seeds, times)
        return out, sampler.fast_path.blocks

    first, blocks = sample()
    stored = sorted(p.name.split("-")[0] for p in (tmp_path / "derived").iterdir())
    assert stored == ["alias"] * 3 + ["tblock32"] * 3 * 3 + ["wpacked12"] * 3, stored
    monkeypatch.setattr(derived, "_BUILT", type(derived._BUILT)())  # as a new process: nothing built in memory
    monkeypatch.setattr(derived, "alias_table", None)  # would fail if called: the stored tables are read
    monkeypatch.setattr(derived, "time_records", None)
    monkeypatch.setattr(derived, "compact_weighted_packed", None)
    again, mapped = sample()
    n = len(mapped.blocks)  # the per-block tuples go on with empty arrays to the kernels' length
    assert all(isinstance(t[b], np.memmap) for t in (mapped.tsort.keys, mapped.tsort.pairs, mapped.tsort.order)
               for b in range(n))
    assert all(isinstance(p, np.memmap) for p in mapped.topo.packed[:n])
    assert torch.equal(first.edge, again.edge) and torch.equal(first.node, again.node)
    assert (g.edge_time[first.edge.numpy()] <= 600).all()


@pytest.mark.parametrize("options", [{}, {"weight_attr": "weight", "time_attr": "edge_time"}])
def test_one_and_three_partitions_run_the_same_compiled_kernel(graphs, options):
    """The kernels' per-block tuples have one length for 1 to 4 blocks, so a rank serving three partitions runs
    the kernel compiled (by the warm-up) for one; a fourth entry would take the next length."""
    from sampling.graph.kernel_args import arity
    from sampling.kernels import hop_kernel

    assert [arity(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [4, 4, 4, 4, 8, 8, 16]
    seeds, times = np.arange(0, 400, 9), np.full(len(np.arange(0, 400, 9)), 10**9)
    compiled = []
    for name in ("dataset1", "dataset3"):
        sampler = NeighborSampler(graphs[name].data, [3, 2], seed=0, **options)
        blocks = sampler.fast_path.blocks
        assert len(blocks.blocks) == int(name[-1]) and len(blocks.topo.indptrs) == 4
        assert _sample(sampler, seeds, times if options else None).row.numel() > 0
        compiled.append(len(hop_kernel.sample_variants.signatures))
    assert compiled[1] == compiled[0], "three blocks compiled a kernel of their own"


def test_the_cut_at_and_around_the_latest_edge_time():
    """A limit at or after the block's latest edge time keeps every edge without reading the times; one
    below it cuts. Full fanout, one hop: each seed's edges are exactly those at or before its time."""
    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 50, 600), rng.integers(0, 50, 600)
    etime = rng.integers(0, 1000, 600)
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=50, time=torch.from_numpy(etime))
    sampler = _variant(NeighborSampler(data, [-1], time_attr="time", seed=1))
    latest = int(etime.max())
    seeds = np.arange(50)
    for when in (latest + 10**9, latest, latest - 1, int(np.median(etime))):
        out = _sample(sampler, seeds, np.full(50, when))
        eid = out.edge.numpy()
        assert sorted(eid.tolist()) == sorted(np.flatnonzero(etime <= when).tolist()), when
        node, row, col = out.node.numpy(), out.row.numpy(), out.col.numpy()
        assert np.array_equal(dst[eid], seeds[col]) and np.array_equal(src[eid], node[row])


def test_the_cut_counts_the_keys_at_or_before_the_limit_wherever_its_guess_lands():
    """The cut over a long segment starts from where the limit would fall were the times even, and widens from
    there: it counts what ``searchsorted`` counts for even, clustered and repeated times, limits below, among,
    between and above the keys, and segments beside other nodes' keys (which it must not read)."""
    from sampling.kernels.picks import _cut
    cut = njit(_cut.py_func)
    rng = np.random.default_rng(11)
    latest = 1_000_000
    for deg in (1, 5, 31, 32, 33, 47, 64, 100, 1000, 5000):
        for shape in ("even", "early", "late", "clustered", "equal"):
            if shape == "even":
                keys = rng.integers(0, latest + 1, deg)
            elif shape == "early":  # all far below where an even spread puts them
                keys = rng.integers(0, latest // 100, deg)
            elif shape == "late":
                keys = rng.integers(latest - latest // 100, latest + 1, deg)
            elif shape == "clustered":
                keys = rng.integers(0, 4, deg) * (latest // 4) + rng.integers(0, 50, deg)
            else:
                keys = np.full(deg, latest // 3)
            keys = np.sort(keys).astype(np.int32)
            pad = rng.integers(0, latest, 40).astype(np.int32)  # other nodes' keys on both sides
            row = np.concatenate([pad, keys, pad])
            probes = {0, latest - 1, int(keys[0]), int(keys[0]) - 1, int(keys[-1]), int(keys[-1]) - 1}
            probes |= set(int(v) for v in keys[rng.integers(0, deg, 8)])
            probes |= set(int(v) for v in rng.integers(0, latest, 8))
            for key in sorted(p for p in probes if 0 <= p < latest):
                want = int(np.searchsorted(keys, key, side="right"))
                assert cut(row, 40, deg, np.int64(key), np.int64(latest)) == want, (deg, shape, key)


def test_edge_ranges_are_each_frontier_nodes_run_of_edges():
    """Disjoint de-duplication reads each frontier node's edges from its (first, count): one run of equal ``col``
    per node, in any order of nodes; a node without edges keeps count 0."""
    from sampling.kernels.idmap import _edge_ranges

    col = np.array([-1, 12, 12, 10, 14, 14, 14, 10, -1], np.int64)  # outside [1, 7): another hop's edges
    first, count = _edge_ranges(col, 1, 7, 10, 15)  # frontier nodes 10..14
    assert count.tolist() == [1, 0, 2, 0, 3]
    assert first[[0, 2, 4]].tolist() == [3, 1, 4]


@pytest.mark.parametrize("wide", [False, True])  # blocked records (32-bit keys), apart ones beside the pairs (64-bit)
def test_temporal_uniform_with_every_edge_eligible_samples_what_disjoint_sampling_does(wide):
    """A node whose limit is at or after its block's latest time draws the plain picks over its CSC pairs: the
    same samples as disjoint sampling, over either layout of the time records."""
    from sampling.warmup.groups import pyg_data

    data = pyg_data(seed=4, wide=wide)
    seeds = torch.arange(0, 60, 3)
    after = torch.full((len(seeds),), int(data.etime.max()) + 1)
    temporal = NeighborSampler(data, [3, 2], time_attr="etime", seed=8).sample_from_nodes(
        NodeSamplerInput(None, seeds, after))
    disjoint = NeighborSampler(data, [3, 2], disjoint=True, seed=8).sample_from_nodes(NodeSamplerInput(None, seeds))
    assert temporal.row.numel() > 20
    for name in ("node", "row", "col", "edge", "batch"):
        assert torch.equal(getattr(temporal, name), getattr(disjoint, name)), name
