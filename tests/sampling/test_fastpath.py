"""The one-call multi-hop kernel (FastPath): when it is taken, that it equals the general path, its
random draws, repeated seeds, and bad IDs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.sampler import NodeSamplerInput

from graphstore.errors import CorruptDatasetError, NotOwnedError
from graphstore.dataset.linksplit import LinkSplit
from sampling import MessageEdges, NeighborSampler
from sampling.drivers.batch_driver import FastPath


def _sample(sampler, seeds):
    return sampler.sample_from_nodes(NodeSamplerInput(None, torch.as_tensor(seeds)))


def _general(data, fanouts, **kw):
    sampler = NeighborSampler(data, fanouts, **kw)
    sampler._fast_path = None
    return sampler


def _per_hop(out):
    """Per hop: the set of (global source, global destination, edge ID); and the node IDs per hop."""
    node = out.node.numpy()
    bounds, nb = np.cumsum([0, *out.num_sampled_edges]), np.cumsum([0, *out.num_sampled_nodes])
    edges = [set(zip(node[out.row[a:b]], node[out.col[a:b]], out.edge[a:b].numpy()))
             for a, b in zip(bounds[:-1], bounds[1:])]
    return edges, [set(node[a:b]) for a, b in zip(nb[:-1], nb[1:])]


def test_fast_path_is_taken_where_it_applies(graphs):
    ds = graphs["dataset3"].data
    fast = NeighborSampler(ds, [3, 2]).fast_path
    assert fast is not None and fast.use_packed and fast.dense
    assert NeighborSampler(graphs["data"].data, [3]).fast_path.use_packed  # in-memory graphs are packed in RAM
    for kw in ({"weight_attr": "weight"}, {"time_attr": "time"}, {"disjoint": True}):  # the variant kernel
        variant = NeighborSampler(ds, [3], **kw).fast_path
        assert variant is not None and not variant.plain and variant.use_packed, kw
    assert NeighborSampler(ds, [3], message_edges=MessageEdges(rule=LinkSplit())).fast_path.plain is False
    one_part = NeighborSampler(ds.partition(1), [3, 3])  # sources outside it: the general path names them
    assert one_part.fast_path is None
    lo, _ = ds.partition(1)[1].dst_range()
    with pytest.raises(NotOwnedError):
        for start in range(lo, lo + 50):
            _sample(one_part, [start])


@pytest.mark.parametrize("backend", ["data", "dataset3"])
@pytest.mark.parametrize("options", [{}, {"packed": False}, {"dense_max_nodes": 0}])
def test_fast_equals_general_with_full_fanout(graphs, backend, options):
    data, seeds = graphs[backend].data, [3, 17, 99, 250, 17]
    fast_sampler = NeighborSampler(data, [-1, -1, -1])
    fast_sampler._fast_path = FastPath(fast_sampler.topology[None], fast_sampler.num_nodes, fast_sampler._fanouts,
                                       False, **options)
    fast, general = _sample(fast_sampler, seeds), _sample(_general(data, [-1, -1, -1]), seeds)
    assert fast.num_sampled_nodes == general.num_sampled_nodes
    assert fast.num_sampled_edges == general.num_sampled_edges
    assert _per_hop(fast) == _per_hop(general)
    assert fast.node[:5].tolist() == seeds, "seeds keep their positions, repeats included"
    part, pos = fast.edge_locator[None]()
    assert len(part) == len(pos) == len(fast.edge)


def test_edge_locator_points_at_the_sampled_edges(graphs):
    ds = graphs["dataset3"].data
    out = _sample(NeighborSampler(ds, [4, 4, 0, 3], seed=0), [5, 50, 150, 300])
    part, pos = out.edge_locator[None]()
    for p in np.unique(part):
        eid = ds.partition(int(p))[1].csc_arrays()[2]
        assert np.array_equal(eid[pos[part == p]], out.edge.numpy()[part == p])


@pytest.mark.parametrize("time", [60, 5000])  # some edges eligible; every edge (CSC picks, ~p positions)
def test_time_sorted_picks_are_located_when_asked_and_before_pickling(graphs, time):
    """Temporal picks are positions in time order; their CSC positions are computed only when edge attributes
    are fetched (or before a batch is pickled to another process), and then point at the sampled edges."""
    import pickle

    ds = graphs["dataset3"].data
    sampler = NeighborSampler(ds, [4, 4, 3], time_attr="edge_time", seed=0)
    seeds, when = torch.tensor([5, 50, 150, 300]), torch.tensor([time] * 4)
    located = []
    for _ in range(2):
        located.append(sampler.sample_from_nodes(NodeSamplerInput(None, seeds, when)))
    pickled = pickle.loads(pickle.dumps(located[1].edge_locator[None]))  # translated before it leaves
    for out, (part, pos) in ((located[0], located[0].edge_locator[None]()),
                             (located[0], located[0].edge_locator[None]()), (located[1], pickled())):  # once only
        for p in np.unique(part):
            eid, edge_time = ds.partition(int(p))[1].csc_arrays()[2], ds.partition(int(p))[1].edge_attr("edge_time")
            assert np.array_equal(eid[pos[part == p]], out.edge.numpy()[part == p])
            assert (edge_time.numpy()[pos[part == p]] <= time).all()


@pytest.mark.parametrize("fanout, replace", [(5, False), (35, False), (6, True)])
def test_draws_are_uniform(graphs, fanout, replace):
    """Floyd (small k), the partial Fisher-Yates shuffle (k > 32, degree < 4k) and draws with
    replacement: every in-edge of the star node is equally likely."""
    g = graphs["dataset3"]
    star = g.to_input.tolist().index(0)
    sampler = NeighborSampler(g.data, [fanout], replace=replace, seed=21)
    assert sampler.fast_path is not None
    counts: dict[int, int] = {}
    for _ in range(400):
        out = _sample(sampler, [star])
        if not replace:
            assert len(set(out.edge.tolist())) == len(out.edge) == fanout
        for e in out.edge.tolist():
            counts[e] = counts.get(e, 0) + 1
    assert len(counts) == np.count_nonzero(g.dst == star)
    assert chisquare(np.array(list(counts.values()))).pvalue > 1e-3


def test_damaged_topology_is_reported_and_the_map_stays_clean(graphs):
    data = graphs["data"].data
    sampler = NeighborSampler(data, [-1, -1])
    good = sampler.topology[None].blocks[0]
    bad = good.packed.copy()
    bad[0::2][np.flatnonzero(good.packed[0::2] == 7)[:1]] = 10**6  # one neighbour ID past the last node
    expected = _sample(_general(data, [-1, -1]), [0, 7, 12])
    sampler.topology[None].blocks[0] = dataclasses.replace(good, packed=bad)
    sampler._fast_path = False
    with pytest.raises(CorruptDatasetError, match="graphstore verify"):
        for seed in range(400):
            _sample(sampler, [seed])
    sampler.topology[None].blocks[0] = good
    sampler._fast_path = False
    assert _per_hop(_sample(sampler, [0, 7, 12])) == _per_hop(expected)


def test_out_of_range_seeds_are_named(graphs):
    sampler = NeighborSampler(graphs["dataset3"].data, [2])
    with pytest.raises(NotOwnedError, match=r"\[400, -1\] are outside \[0, 400\)"):
        _sample(sampler, [1, 400, -1])


@pytest.mark.parametrize("offsets", [[0, 5000], [0, 100, 100, 2600, 70000], [300, 1000, 5000, 10**6]])
def test_frontier_sort_by_id(offsets):
    from sampling.kernels.frontier import by_block, by_id

    offsets = np.array(offsets, np.int64)
    rng = np.random.default_rng(1)
    nodes = np.concatenate([np.zeros(7, np.int64), rng.integers(offsets[0], offsets[-1], 6000)])
    order, bounds, ids = by_id(offsets, nodes, 7, len(nodes))
    front = nodes[7:]
    assert np.array_equal(np.sort(order), np.arange(len(front)))
    assert np.all(np.diff(front[order]) >= 0) and np.array_equal(ids, front[order])
    _, expected, _ = by_block(offsets, nodes, 7, len(nodes))
    assert np.array_equal(bounds, expected)


def test_large_frontiers_match_the_general_path():
    """Frontiers of ≥ 4,096 nodes are visited in ID order: same neighbourhoods as the general path."""
    from torch_geometric.data import Data

    rng = np.random.default_rng(2)
    n, m = 30_000, 240_000
    data = Data(edge_index=torch.from_numpy(rng.integers(0, n, (2, m))), num_nodes=n)
    seeds = rng.choice(n, 600, replace=False)
    fast_sampler = NeighborSampler(data, [-1, -1])
    assert fast_sampler.fast_path is not None
    fast, general = _sample(fast_sampler, seeds), _sample(_general(data, [-1, -1]), seeds)
    assert fast.num_sampled_nodes[1] >= 4096
    assert fast.num_sampled_edges == general.num_sampled_edges
    assert _per_hop(fast) == _per_hop(general)
    sampled = NeighborSampler(data, [5, 5], seed=3)
    out = _sample(sampled, seeds)
    node = out.node.numpy()
    src, dst = data.edge_index.numpy()
    assert np.array_equal(node[out.row], src[out.edge]) and np.array_equal(node[out.col], dst[out.edge])


def test_datasets_without_packed_topology_use_the_int64_arrays(graphs, monkeypatch):
    """A dataset written before ``packed`` existed (or with IDs ≥ 2**31) has none: same results."""
    from graphstore.dataset.stores import ZarrGraphStore

    ds, seeds = graphs["dataset3"].data, [3, 17, 99, 250]
    expected = _per_hop(_sample(NeighborSampler(ds, [-1, -1]), seeds))
    monkeypatch.setattr(ZarrGraphStore, "packed_csc", lambda self, edge_type=None: None)
    sampler = NeighborSampler(ds, [-1, -1])
    assert sampler.fast_path is not None and not sampler.fast_path.use_packed
    assert _per_hop(_sample(sampler, seeds)) == expected


@pytest.mark.parametrize("backend", ["data", "dataset3"])
@pytest.mark.parametrize("fanouts", [[-1, 0, -1], [2, 0, 3], [0, -1]])
def test_a_zero_hop_ends_the_frontier_as_in_the_general_path(graphs, backend, fanouts):
    data, seeds = graphs[backend].data, [3, 17, 99, 250]
    fast_sampler = NeighborSampler(data, fanouts)
    assert fast_sampler.fast_path is not None
    fast, general = _sample(fast_sampler, seeds), _sample(_general(data, fanouts), seeds)
    zero = fanouts.index(0)
    assert fast.num_sampled_nodes[zero + 1:] == [0] * (len(fanouts) - zero)
    assert fast.num_sampled_edges[zero:] == [0] * (len(fanouts) - zero)
    if -1 in fanouts[:zero] or zero == 0:  # deterministic before the zero: the whole output must match
        assert _per_hop(fast) == _per_hop(general)
    assert len(fast.row) == sum(fast.num_sampled_edges)


def test_an_error_inside_the_kernel_leaves_no_stale_nodes(graphs, monkeypatch):
    """A MemoryError mid-batch used to leave the batch's nodes marked as seen: later batches mapped
    them to stale local IDs."""
    from sampling.drivers import batch_driver
    from sampling.kernels import hop_kernel, idmap

    data = graphs["dataset3"].data
    sampler = NeighborSampler(data, [-1, -1])
    before = _per_hop(_sample(sampler, [3, 17]))
    real = hop_kernel.sample_variants

    def fails_midway(topo, seeds, fanouts, replace, state, ids, *rest):
        idmap.insert_seeds(ids.seen, ids.dense, ids.table, np.array([17, 250, 99]), np.empty(3, np.int64))
        raise MemoryError("simulated: allocation failed inside the kernel")

    monkeypatch.setattr(batch_driver.hop_kernel, "sample_variants", fails_midway)
    with pytest.raises(MemoryError):
        _sample(sampler, [250, 99])
    monkeypatch.setattr(batch_driver.hop_kernel, "sample_variants", real)
    assert _per_hop(_sample(sampler, [3, 17])) == before


@pytest.mark.parametrize("kw", [{}, {"time_attr": "time"}])
def test_buffers_sized_by_the_last_batch_sample_what_the_largest_buffers_do(graphs, kw):
    """The kernel's output buffers start at the room the thread's last batch needed: a batch that needs more
    grows them mid-batch and samples what buffers sized for the most a batch can hold would."""
    from sampling.kernels.frontier import buffer_len

    sampler, seeds = NeighborSampler(graphs["dataset3"].data, [10, 5], **kw), np.arange(0, 400, 2)

    def sample(ids):  # temporal: seed times in the middle of the edge times (0..99)
        return sampler.sample_from_nodes(NodeSamplerInput(None, torch.as_tensor(ids),
                                                          torch.full((len(ids),), 50) if kw else None))

    sample(seeds[:1])  # a one-seed batch: the next starts with room for about one seed's picks
    local = sampler._local
    start = int(local.sizes[0])
    assert 0 < start < buffer_len(len(seeds), np.array([10, 5])) // 20
    state = local.rng.copy()
    grown = sample(seeds)
    assert local.sizes[2] > 20 * start, "the batch needed far more room than it started with"
    local.sizes[:], local.rng[:] = 0, state  # the largest buffers, the same draws
    largest = sample(seeds)
    for name in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(grown, name), getattr(largest, name)), name
    assert grown.num_sampled_edges == largest.num_sampled_edges and len(grown.edge) > 100


def test_a_temporal_batch_needs_room_for_the_edges_it_can_pick_not_for_every_edge_of_its_frontier():
    """A hop makes room for its picks a run of nodes at a time, so the room a batch reports needing (the next
    batch's buffers) ends near the edges it wrote: with a tenth of the edges before the seeds' times, far
    under its frontier's most picks (``fit_buffer`` would copy every batch out of buffers that large)."""
    from sampling.kernels.hop_kernel import _RUN_PICKS
    from torch_geometric.data import Data

    n, deg = 6000, 20
    rng = np.random.default_rng(5)
    dst = np.repeat(np.arange(n), deg)
    data = Data(edge_index=torch.from_numpy(np.stack([rng.integers(0, n, n * deg), dst])), num_nodes=n,
                time=torch.from_numpy(rng.integers(0, 1000, n * deg)))
    sampler, seeds = NeighborSampler(data, [20, 20], time_attr="time"), np.arange(0, n, 3)
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.as_tensor(seeds), torch.full((len(seeds),), 99)))
    edges = out.num_sampled_edges
    most = len(seeds) * deg + edges[0] * deg  # every edge of the seeds and of the first hop's nodes
    need = int(sampler._local.sizes[2])
    assert edges[0] + edges[1] <= need <= edges[0] + edges[1] + _RUN_PICKS, (need, edges)
    assert need < most // 2, (need, most)


def test_a_hop_from_empty_buffers_makes_its_room_in_one_allocation_and_keeps_what_it_wrote():
    """A partition server's hop starts from empty buffers: under a time limit its runs of nodes grow them once,
    to the hop's most picks (not by doublings from the first run's room, each a copy), and the picks are those
    of a caller whose buffers already had room (an edge source's picks in the ``row`` they came from)."""
    from torch_geometric.data import Data
    from sampling.drivers.hop_driver import run_kernel
    from sampling.kernels.hop_kernel import _RUN_PICKS
    from sampling.kernels.rng import rng_state

    n, deg = 6000, 20
    rng = np.random.default_rng(7)
    data = Data(edge_index=torch.from_numpy(np.stack([rng.integers(0, n, n * deg), np.repeat(np.arange(n), deg)])),
                num_nodes=n, time=torch.from_numpy(rng.integers(0, 100, n * deg)))
    args = NeighborSampler(data, [15], time_attr="time").fast_path.blocks
    ids, limits = np.arange(n), np.full(n, 98)  # most nodes keep 15 or more of their 20 edges
    row, col, eid, pos, _ = run_kernel(args, rng_state(3), ids, 15, False, False, limits, None, True)
    assert len(ids) * 15 > 3 * _RUN_PICKS and len(row) > 3 * _RUN_PICKS
    assert len(row.base) == len(ids) * 15, "one allocation of the hop's most picks"
    src, dst = data.edge_index.numpy()
    assert np.array_equal(src[eid], row) and np.array_equal(dst[eid], ids[col])
    assert (data.time.numpy()[eid] <= 98).all()
    again = run_kernel(args, rng_state(3), ids, 15, False, False, limits, None, True)
    assert all(np.array_equal(a, b) for a, b in zip((row, col, eid, pos), again[:4]))


def test_a_pair_of_dataset_stores_returns_input_edge_ids(graphs):
    from graphstore.dataset.whole import DatasetFeatureStore, DatasetGraphStore

    g = graphs["dataset3"]
    pair = (DatasetFeatureStore(g.data), DatasetGraphStore(g.data))
    for sampler in (NeighborSampler(pair, [-1]), _general(pair, [-1])):
        out = _sample(sampler, np.arange(g.num_nodes))
        node, edge = out.node.numpy(), out.edge.numpy()
        assert len(edge) == len(g.src)
        assert np.array_equal(node[out.row], g.src[edge]) and np.array_equal(node[out.col], g.dst[edge])
    assert NeighborSampler(pair, [-1]).fast_path is not None


def test_prefault_picks_the_arrays_the_sampler_will_read(graphs, monkeypatch):
    """The packed pairs wherever the dataset has them: both drivers of the one engine (one-call, per-hop)
    and the partition servers read those; the int64 arrays only for a dataset without them."""
    from graphstore.dataset.stores import ZarrGraphStore
    from sampling.graph import topology

    ds = graphs["dataset3"].data
    touched: list[int] = []
    monkeypatch.setattr(topology, "prefault", lambda a: touched.append(a.dtype.itemsize))
    cases = [{"parts": [0, 1, 2]}, {"parts": [0, 1, 2], "disjoint": True}, {"parts": [0, 1, 2], "weight_attr": "weight"},
             {"parts": [1]}]
    for kw in cases:
        touched.clear()
        kw = {"weight_attr": None, "time_attr": None, **kw}
        topology.from_dataset(ds, **kw)
        packed_read = touched.count(4)  # packed is the only int32 topology array
        assert packed_read == len(kw["parts"]) and len(touched) == 2 * len(kw["parts"]), (kw, touched)
    from graphstore.dataset.whole import DatasetFeatureStore, DatasetGraphStore

    for disjoint in (False, True):  # a pair of dataset stores prefaults as the dataset does (any variant)
        touched.clear()
        NeighborSampler((DatasetFeatureStore(ds), DatasetGraphStore(ds)), [2], disjoint=disjoint)
        assert 4 in touched and len(touched) == 2 * ds.num_parts, (disjoint, touched)
    touched.clear()
    NeighborSampler(ds.partition(1), [2], disjoint=True)  # one partition's stores: the per-hop driver, packed too
    assert touched == [8, 4], touched
    touched.clear()
    monkeypatch.setattr(ZarrGraphStore, "packed_csc", lambda self, edge_type=None: None)
    topology.from_dataset(ds, [1], None, None)  # no packed pairs stored: the int64 arrays
    assert touched == [8, 8, 8], touched


def test_numpy_integer_fanouts_are_accepted_and_bools_refused(graphs):
    from graphstore.errors import InvalidInputError

    data = graphs["data"].data
    out = _sample(NeighborSampler(data, [np.int64(3), np.int32(2)]), [5])
    assert out.num_sampled_edges[0] <= 3
    with pytest.raises(InvalidInputError, match="num_neighbors"):
        NeighborSampler(data, [True, 2])
