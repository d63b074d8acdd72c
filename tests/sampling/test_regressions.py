"""Regression tests for sampler and loader bugs found in review (each failed before its fix)."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from graphstore.errors import InvalidInputError, NotOwnedError
from sampling import NeighborSampler
from sampling.distributed.dist_loader import DistributedNeighborLoader
from sampling.loader.loader_threads import Prefetcher
from sampling.distributed.dist_features import DistributedFeatureStore
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import RemoteStats
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport


def test_maps_are_empty_after_batches_with_growth_and_repeated_seeds():
    """(Was a test of the deleted general path's NodeTable.reset.) After batches whose hash tables grow
    and whose seeds repeat, both drivers leave this thread's maps empty for the next batch."""
    from sampling.drivers.batch_driver import FastPath

    rng = np.random.default_rng(0)
    data = HeteroData()
    data["a"].num_nodes = 5000
    data["a", "to", "a"].edge_index = torch.from_numpy(rng.integers(0, 5000, (2, 80000)))
    homo = Data(edge_index=data["a", "to", "a"].edge_index, num_nodes=5000)
    hetero = NeighborSampler(data, [10, 10], disjoint=True, seed=0)  # per-hop driver, (subgraph, node) hash
    plain = NeighborSampler(homo, [10, 10], seed=0)
    plain._fast_path = FastPath(plain.topology[None], 5000, plain._fanouts, False, dense_max_nodes=0)  # hash map
    for trial in range(20):
        seeds = rng.integers(0, 5000, 20)
        seeds = torch.from_numpy(np.concatenate([seeds, seeds[:2]]))
        hetero.sample_from_nodes(NodeSamplerInput(None, seeds, input_type="a"))
        plain.sample_from_nodes(NodeSamplerInput(None, seeds))
        for table in (hetero._local.hop_maps["a"][2], plain._local.table):  # interleaved (key, value) slots
            assert len(table) > 1 << 12 and (table[0::2] == -1).all(), f"trial {trial}: stale keys survived"


def test_repeated_seeds_keep_true_edges():
    data = Data(edge_index=torch.tensor([[7], [5]]), num_nodes=10)
    out = NeighborSampler(data, [-1]).sample_from_nodes(NodeSamplerInput(None, torch.tensor([5, 5, 7])))
    pairs = set(zip(out.node[out.row].tolist(), out.node[out.col].tolist()))
    assert pairs == {(7, 5)}, pairs


def test_two_threads_sharing_a_sampler_do_not_corrupt_each_other():
    rng = np.random.default_rng(1)
    data = Data(edge_index=torch.from_numpy(rng.integers(0, 2000, (2, 20000))), num_nodes=2000)
    sampler = NeighborSampler(data, [5, 5], seed=0)
    errors = []

    def work():
        for _ in range(15):
            out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.from_numpy(rng.choice(2000, 64, False))))
            if len(out.row) and int(max(out.row.max(), out.col.max())) >= len(out.node):
                errors.append("local id out of range")

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_temporal_edge_types_without_times_are_unconstrained():
    data = HeteroData()
    data["paper"].x, data["paper"].time = torch.randn(50, 2), torch.arange(50)
    data["author"].x = torch.randn(20, 2)
    data["author", "writes", "paper"].edge_index = torch.stack([torch.arange(50) % 20, torch.arange(50)])
    data["paper", "cites", "paper"].edge_index = torch.stack([torch.arange(49), torch.arange(1, 50)])
    sampler = NeighborSampler(data, [3], time_attr="time", temporal_strategy="last")
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([40, 41]), torch.tensor([45, 45]),
                                                     input_type="paper"))
    assert out.row[("author", "writes", "paper")].numel() == 2  # every paper has one author, no time needed
    cited = out.node["paper"][out.row[("paper", "cites", "paper")]]
    assert (cited <= 45).all()


def _half_weighted_graph() -> HeteroData:
    """Papers cite papers with weights (zero on every even edge); authors write papers, unweighted."""
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(60, 2), torch.randn(30, 2)
    src = torch.arange(60).repeat_interleave(6) % 60
    dst = (src + torch.arange(360) % 6 + 1) % 60
    data["paper", "cites", "paper"].edge_index = torch.stack([src, dst])
    data["paper", "cites", "paper"].w = (torch.arange(360) % 2).double()  # only odd edges can be drawn
    data["author", "writes", "paper"].edge_index = torch.stack([torch.arange(120) % 30, torch.arange(120) % 60])
    return data


@pytest.mark.parametrize("source", ["memory", "dataset"])
def test_weighted_sampling_of_a_graph_whose_other_edge_types_have_no_weights(source, tmp_path):
    """Edge types without the weight attribute sample uniformly, as in PyG; they used to hand an empty weight
    array to the alias-table kernel, which wrote past it (a heap corruption abort)."""
    data = _half_weighted_graph()
    graph = data
    if source == "dataset":
        graphstore.ingest(data, tmp_path / "g", num_parts=1)
        graph = graphstore.open_dataset(tmp_path / "g")
    sampler = NeighborSampler(graph, [4, 4], weight_attr="w", seed=0)
    cites, writes = ("paper", "cites", "paper"), ("author", "writes", "paper")
    seen_writes = 0
    for first in range(0, 60, 10):
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(first, first + 10), input_type="paper"))
        assert out.edge[cites].numel() > 0 and (out.edge[cites] % 2 == 1).all(), "a zero-weight edge was drawn"
        seen_writes += out.edge[writes].numel()
    assert seen_writes > 0, "the unweighted edge type sampled nothing"


def test_node_times_of_one_partitions_stores_cover_every_source(tmp_path):
    """A sampler over one partition's stores with a node-level time_attr: sources of other partitions have
    times too (their times used to be indexed in the partition's own rows: IndexError)."""
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(3)
    nodes = NodeTable(400, {"x": ArrayRows(rng.standard_normal((400, 2)).astype(np.float32)),
                            "time": ArrayRows(rng.integers(0, 100, 400))})
    source = GraphSource({None: nodes}, {None: EdgeTable(rng.integers(0, 400, 3000), rng.integers(0, 400, 3000), {})})
    graphstore.ingest(source, tmp_path / "g", num_parts=2, method="random")
    ds = graphstore.open_dataset(tmp_path / "g")
    times = np.concatenate([ds.partition(p)[0][None, "time", None].numpy() for p in range(2)])
    lo, hi = (int(v) for v in ds.node_offsets()[1:3])  # partition 1's nodes
    sampler = NeighborSampler(ds.partition(1), [8], time_attr="time", seed=0)
    seeds = torch.arange(lo, hi)
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds, torch.full((len(seeds),), 50)))
    sources = out.node[out.row].numpy()
    assert len(sources) > 0 and (sources < lo).any(), "no source from the other partition was sampled"
    assert (times[sources] <= 50).all(), "a source later than its seed was sampled"


@pytest.fixture(scope="module")
def halo_x_only(tmp_path_factory):
    from tests.conftest import small_graph

    source, expected = small_graph(n=300, e=2500, seed=9)
    dest = tmp_path_factory.mktemp("halo") / "ds"
    graphstore.ingest(source, dest, num_parts=2, halo_features="x")
    return graphstore.open_dataset(dest), expected


def test_distributed_fetch_with_partial_halo_replicas(halo_x_only):
    ds, expected = halo_x_only
    transports = LoopbackTransport.group(2)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    order = np.concatenate([ds.partition(p)[0][None, "orig_id", None].numpy() for p in range(2)])
    loader = DistributedNeighborLoader(ds, [5, 5], transports[0], torch.arange(0, 40), batch_size=40, prefetch=0)
    batch = next(iter(loader))
    assert np.array_equal(batch.y.numpy(), expected.node_attrs[None]["y"][order[batch.n_id.numpy()]])
    assert np.allclose(batch.x.numpy(), expected.node_attrs[None]["x"][order[batch.n_id.numpy()]])


def test_distributed_loader_splits_a_partitions_seeds_between_its_ranks(halo_x_only):
    ds, _ = halo_x_only
    transports = LoopbackTransport.group(4)
    layout = RankLayout(2, 4)
    for rank, t in enumerate(transports):
        PartitionServer(ds, layout.part_of(rank)).register(t)
    seeds = [DistributedNeighborLoader(ds, [2], transports[r], None, layout=layout, batch_size=1000,
                                       prefetch=0).input_data.node for r in (0, 1)]
    assert len(set(seeds[0].tolist()) & set(seeds[1].tolist())) == 0
    lo, hi = ds.node_offsets()[:2]
    assert sorted(torch.cat(seeds).tolist()) == list(range(lo, hi))


def test_prefetcher_finishes_cleanly():
    p = Prefetcher(iter(range(3)), depth=1)
    assert list(p) == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(p)  # again: no hang
    p2 = Prefetcher(iter(range(1000)), depth=1)
    next(p2)
    p2.close(timeout=5)
    assert not p2._thread.is_alive()

    def boom():
        yield 1
        raise ValueError("sampler broke")

    p3 = Prefetcher(boom())
    assert next(p3) == 1
    with pytest.raises(ValueError, match="sampler broke"):
        next(p3)


def test_distributed_objects_pickle_and_reject_torchs_worker_options(halo_x_only):
    ds, _ = halo_x_only
    t = LoopbackTransport.group(2)[0]
    pickle.loads(pickle.dumps(RemoteStats(requests=3))).add(requests=1)
    store = DistributedFeatureStore(ds, t, RankLayout(2, 2))
    assert pickle.loads(pickle.dumps(store.stats)).requests == 0
    with pytest.raises(InvalidInputError, match="persistent_workers is torch's worker option"):
        DistributedNeighborLoader(ds, [2], t, torch.arange(5), num_workers=2, persistent_workers=True)


def test_dataset_store_names_ids_out_of_range(halo_x_only):
    from graphstore.dataset.whole import DatasetFeatureStore

    ds, _ = halo_x_only
    with pytest.raises(NotOwnedError, match=r"outside \[0, 300\)"):
        DatasetFeatureStore(ds)[None, "x", torch.tensor([1, 300])]


def _star_loader_batches(seed, workers=2, loader=None):
    """Four batches of the same seed (node 0, 199 in-neighbours, fanout 5): one per worker in turn."""
    from sampling import NeighborLoader

    if loader is None:
        n = 200
        data = Data(edge_index=torch.stack([torch.arange(1, n), torch.zeros(n - 1, dtype=torch.long)]), num_nodes=n)
        loader = NeighborLoader(data, [5], input_nodes=torch.zeros(4, dtype=torch.long), batch_size=1, seed=seed,
                                num_workers=workers)
    return loader, [tuple(sorted(b.n_id[1:].tolist())) for b in loader]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 7])
def test_forked_workers_draw_their_own_streams_every_pass(seed):
    """Forked workers used to inherit the parent's seeded generator (after any main-process sample)
    and, with ``seed=``, to repeat the previous pass."""
    loader, first = _star_loader_batches(seed)
    loader.node_sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0])))  # main process samples
    _, second = _star_loader_batches(seed, loader=loader)
    assert len(set(first)) == 4, f"workers or batches repeated a draw: {first}"
    assert len(set(second)) == 4 and not set(first) & set(second), (first, second)
    if seed is not None:  # reproducible: a new loader with the same seed draws the same first pass
        assert _star_loader_batches(seed)[1] == first
