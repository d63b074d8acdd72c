"""Distributed sampling equals single-process sampling (loopback and RPC); requests are batched."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from tests.conftest import join_spawned, spawn_ranks
from tests.sampling.conftest import serve_and_run
from sampling.distributed.dist_loader import DistributedNeighborLoader
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import DistributedSampler
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport, PeerError


@pytest.fixture(scope="module")
def ds(tmp_path_factory, graphs):
    return graphs["dataset3"].data


def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


@pytest.mark.parametrize("dense", [True, False], ids=["dense map", "hash map"])
def test_loopback_full_fanout_is_the_raw_neighbourhood(ds, graphs, dense, monkeypatch):
    from tests.sampling.test_exact import oracle_hops

    if not dense:  # as on a graph above PERHOP_DENSE_MAX_NODES: the de-duplication map is the hash table
        monkeypatch.setattr("sampling.drivers.hop_driver.PERHOP_DENSE_MAX_NODES", 0)
    g = graphs["dataset3"]
    transports = _group(ds)
    layout = RankLayout(3, 3)
    for rank, transport in enumerate(transports):
        lo, hi = ds.node_offsets()[rank: rank + 2]
        seeds = torch.arange(lo, min(hi, lo + 15))
        b = DistributedSampler(ds, [-1, -1, -1], transport, layout).sample_from_nodes(NodeSamplerInput(None, seeds))
        want, reached = oracle_hops(g.src, g.dst, seeds.numpy(), 3)
        bounds = np.cumsum([0, *b.num_sampled_edges])
        assert [sorted(b.edge.tolist()[bounds[i]: bounds[i + 1]]) for i in range(3)] == [h.tolist() for h in want]
        assert sorted(b.node.tolist()) == sorted(reached)
        assert b.num_sampled_nodes[0] == len(seeds) and sum(b.num_sampled_nodes) == len(reached)


def test_a_damaged_sampling_answer_is_refused_in_one_line(ds):
    """A peer whose answer's per-node counts do not add up to its edges (a damaged rank) stops the batch
    with one line naming the partition, instead of merging edges onto the wrong nodes."""
    from graphstore.errors import CorruptDatasetError
    from sampling.distributed.wire import pack

    transports = _group(ds)
    answer = transports[1]._table[(1, "graphstore.sample")]

    def short_count(*args):
        counts, *rest = answer(*args)
        values = counts.values.copy()
        values[values.argmax()] += 1  # one more edge counted than sent
        return (pack(values.astype(np.int64) + counts.base), *rest)

    transports[1].register("graphstore.sample", short_count)
    lo, hi = ds.node_offsets()[:2]
    sampler = DistributedSampler(ds, [10, 10], transports[0], RankLayout(3, 3))
    with pytest.raises(CorruptDatasetError, match=r"^partition 1 answered \d+ edges with counts .* run `graphstore "
                                                  r"verify`"):
        sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(lo, min(hi, lo + 40))))


def _recording(transport):
    """Wrap ``transport.call`` to log (peer, handler name) of every call."""
    log, call = [], transport.call

    def recorded(peer, name, *args):
        log.append((peer, name))
        return call(peer, name, *args)

    transport.call = recorded
    return log


def test_one_request_per_remote_partition_per_hop_and_batch(ds, graphs):
    from sampling.distributed.server import EDGE_ATTR, GATHER, SAMPLE

    transports = _group(ds)
    log = _recording(transports[0])
    loader = DistributedNeighborLoader(ds, [4, 4], transports[0], torch.arange(0, 60), batch_size=30,
                                       prefetch=0)
    g = graphs["dataset3"]
    edge_attrs = sorted(ds.manifest.edge_types[0].attrs)
    total = 0
    for batch in loader:
        n_id, e_id = batch.n_id.numpy(), batch.e_id.numpy()
        assert np.array_equal(n_id[batch.edge_index[0].numpy()], g.src[e_id])
        assert np.array_equal(n_id[batch.edge_index[1].numpy()], g.dst[e_id])
        assert np.allclose(batch.x.numpy(), g.x[n_id])
        assert np.allclose(batch.weight.numpy(), g.weight[e_id])
        # what the batch needed from other partitions, from its own nodes and edges
        bounds = np.cumsum([0, *batch.num_sampled_nodes])
        frontiers = [n_id[bounds[h]: bounds[h + 1]] for h in range(2)]  # the nodes each hop expanded
        remote = lambda ids: sorted(set(ds.owner(ids).tolist()) - {0})  # noqa: E731
        want = [(p, SAMPLE) for f in frontiers for p in remote(f)]
        want += [(p, GATHER) for p in remote(n_id)]
        want += [(p, EDGE_ATTR) for _ in edge_attrs for p in remote(g.dst[e_id])]
        got = log[total:]
        assert sorted(got) == sorted(want), (got, want)  # exactly one per remote partition per hop / batch
        assert any(name == SAMPLE for _, name in got)
        total = len(log)
    stats = loader.stats.snapshot()
    assert stats["requests"] == transports[0].calls == total > 0


def test_remote_row_cache_serves_repeats(ds):
    transports = _group(ds)
    loader = DistributedNeighborLoader(ds, [-1], transports[1], torch.arange(150, 170), batch_size=20,
                                       prefetch=0, cache_rows=4096)
    list(loader)
    first = loader.stats.snapshot(reset=True)
    list(loader)
    second = loader.stats.snapshot()
    assert first["cache_misses"] > 0 and second["cache_hits"] >= first["cache_misses"]
    assert second["rows"] == 0, "every remote row came from the cache the second time"


def test_prefetch_overlaps_and_reraises(ds):
    transports = _group(ds)
    loader = DistributedNeighborLoader(ds, [3], transports[0], torch.arange(0, 40), batch_size=10, prefetch=2)
    assert sum(b.batch_size for b in loader) == 40
    transports[1]._table.clear()  # rank 1 "dies": its handlers are gone
    with pytest.raises(PeerError, match="rank 1"):
        for _ in DistributedNeighborLoader(ds, [-1, -1], transports[0], torch.arange(0, 40), batch_size=40):
            pass


def _rpc_worker(ds, transport, rank: int, world_size: int) -> dict:
    """Full-fanout sampling of 12 own seeds over RPC (``serve_and_run``'s body)."""
    lo = int(ds.node_offsets()[rank])
    seeds = torch.arange(lo, lo + 12)
    sampler = DistributedSampler(ds, [-1, -1], transport, RankLayout(ds.num_parts, world_size))
    out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
    bounds = np.cumsum([0, *out.num_sampled_edges])  # per hop, as sampled (a duplicate would show)
    hops = [out.edge.numpy()[bounds[i]: bounds[i + 1]] for i in range(len(bounds) - 1)]
    return {"nodes": sorted(out.node.tolist()), "edges": [sorted(map(int, e)) for e in hops],
            "requests": sampler.stats.snapshot()["requests"]}


@pytest.mark.distributed
def test_rpc_full_fanout_is_the_raw_neighbourhood(tmp_path):

    from graphstore.dataset.whole import DatasetFeatureStore
    from tests.conftest import small_graph
    from tests.sampling.test_exact import oracle_hops

    source, expected = small_graph(n=500, e=4000, seed=3)
    graphstore.ingest(source, tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    order = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()  # global ID -> input ID
    to_global = np.empty_like(order)
    to_global[order] = np.arange(len(order))
    src, dst = (to_global[a] for a in expected.edges[None])  # the raw edge list, in global IDs
    ctx = spawn_ranks(serve_and_run, (2, f"file://{tmp_path}/rdzv", str(tmp_path / "ds"), str(tmp_path), _rpc_worker), 2)
    join_spawned(ctx, 120)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in got, f"rank {rank} failed:\n{got.get('error')}"
        lo = int(ds.node_offsets()[rank])
        want, reached = oracle_hops(src, dst, np.arange(lo, lo + 12), 2)
        assert got["nodes"] == sorted(reached)
        assert got["edges"] == [h.tolist() for h in want]
        assert got["requests"] >= 1


@pytest.mark.parametrize("world_size", [1, 2, 4, 5])
def test_any_rank_count_over_three_partitions_is_the_raw_neighbourhood(ds, graphs, world_size):
    """Ranks owning several partitions (1, 2 ranks) or sharing one (4, 5) sample and gather exactly."""
    from graphstore.dataset.whole import DatasetFeatureStore
    from sampling.distributed.dist_features import DistributedFeatureStore
    from tests.sampling.test_exact import oracle_hops

    g, layout = graphs["dataset3"], RankLayout(3, world_size)
    transports = LoopbackTransport.group(world_size)
    for rank, t in enumerate(transports):
        PartitionServer(ds, layout.parts_of(rank)).register(t)
    assert {p for r in range(world_size) for p in layout.parts_of(r)} == {0, 1, 2}
    everyone = DatasetFeatureStore(ds)
    for rank, transport in enumerate(transports):
        seeds = torch.tensor([int(ds.node_offsets()[p]) + k for p in range(3) for k in (0, 5, 9)])
        b = DistributedSampler(ds, [-1, -1], transport, layout).sample_from_nodes(NodeSamplerInput(None, seeds))
        want, reached = oracle_hops(g.src, g.dst, seeds.numpy(), 2)
        bounds = np.cumsum([0, *b.num_sampled_edges])
        assert [sorted(b.edge.tolist()[bounds[i]: bounds[i + 1]]) for i in range(2)] == [h.tolist() for h in want]
        assert sorted(b.node.tolist()) == sorted(reached)
        store = DistributedFeatureStore(ds, transport, layout)
        assert torch.equal(store[None, "x", b.node], everyone[None, "x", b.node])


@pytest.mark.parametrize("text, lost", [
    ("process_vm_readv: No such process (this error originated at tensorpipe/channel/cma/context_impl.cc:60)", True),
    ("pipe closed (this error originated at tensorpipe/core/pipe_impl.cc:356)", True),
    ("RPC ran for more than set timeout (120000 ms) and will now be marked with an error", True),
    ("index 7 is out of bounds for dimension 0 with size 3", False),
])
def test_a_peer_that_died_is_told_from_a_handler_that_raised(text, lost):
    """The survivor names a lost peer ("did not answer": the trainer says which rank and host) only for the
    RPC agent's own errors, whatever channel carried the call: a peer on the same machine killed mid-transfer
    fails tensorpipe's memory read with ESRCH (a CI run named it a handler error instead)."""
    from sampling.distributed.transport import RpcTransport

    error = RpcTransport(0, 2)._error(1, "graphstore.gather", RuntimeError(text))
    assert ("did not answer" in str(error)) is lost, str(error)
    assert error.peer == 1 and error.handler == "graphstore.gather"


def test_a_homogeneous_batch_sizes_its_arrays_once():
    from sampling.drivers.hop_driver import _most_picks

    assert _most_picks(1024, [{None: 15}, {None: 10}, {None: 5}]) == 1024 * (15 + 150 + 750)
    assert _most_picks(1024, [{None: 15}, {None: -1}]) == 0  # every neighbour: no bound, the arrays grow
    assert _most_picks(10**6, [{None: 25}, {None: 20}]) == 0  # above the cap: they grow as needed


def test_remote_edges_answered_without_positions_locate_at_minus_one_and_local_ones_at_their_csc_place(ds, graphs,
                                                                                                      monkeypatch):
    """An answer without CSC positions (no edge attribute asks for them) leaves its edges' positions unwritten
    until a batch asks where its edges are: then they are -1, and the local edges' are where their edge IDs are."""
    from sampling.distributed.wire import EDGE_IDS

    monkeypatch.setattr(DistributedSampler, "_returns", lambda self, edge_type: EDGE_IDS)
    transports = _group(ds)
    lo, hi = ds.node_offsets()[:2]
    out = DistributedSampler(ds, [6, 6], transports[0], RankLayout(3, 3), seed=1).sample_from_nodes(
        NodeSamplerInput(None, torch.arange(lo, min(hi, lo + 40))))
    part, pos = out.edge_locator[None]()
    eid = out.edge.numpy()
    assert (part != 0).any() and (part == 0).any()
    assert (pos[part != 0] == -1).all()
    store = ds.partition(0)[1]
    local = pos[part == 0]
    assert np.array_equal(store.edge_attr("weight", None, torch.from_numpy(local)).numpy(),
                          graphs["dataset3"].weight[eid[part == 0]])


def test_a_batch_larger_than_the_last_grows_its_arrays_and_samples_real_edges(ds, graphs):
    """Each thread sizes a batch's node array by its last batch's edges: a larger batch after a small one grows it."""
    g = graphs["dataset3"]
    transports = _group(ds)
    lo, hi = ds.node_offsets()[:2]
    sampler = DistributedSampler(ds, [5, 5], transports[0], RankLayout(3, 3), seed=3)
    for seeds in (torch.arange(lo, lo + 1), torch.arange(lo, hi), torch.arange(lo, lo + 2)):
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
        node, eid = out.node.numpy(), out.edge.numpy()
        assert len(np.unique(node)) == len(node) and np.array_equal(node[:len(seeds)], seeds.numpy())
        assert np.array_equal(node[out.row.numpy()], g.src[eid]) and np.array_equal(node[out.col.numpy()], g.dst[eid])
