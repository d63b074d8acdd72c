"""Distributed sampling equals single-process sampling (loopback and RPC); requests are batched."""

from __future__ import annotations

import json
import traceback

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from tests.conftest import join_spawned
from sampling import NeighborSampler
from sampling.dist_loader import DistributedNeighborLoader
from sampling.distributed import DistributedSampler, PartitionServer, RankLayout
from sampling.transport import LoopbackTransport, PeerError


@pytest.fixture(scope="module")
def ds(tmp_path_factory, graphs):
    return graphs["dataset3"].data


def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


def _edges(out):
    bounds = np.cumsum([0, *out.num_sampled_edges])
    return [set(out.edge.numpy()[bounds[i]: bounds[i + 1]]) for i in range(len(bounds) - 1)]


def test_loopback_full_fanout_equals_single_process(ds, graphs):
    transports = _group(ds)
    layout = RankLayout(3, 3)
    whole = NeighborSampler(ds, [-1, -1, -1])
    for rank, transport in enumerate(transports):
        lo, hi = ds.node_offsets()[rank: rank + 2]
        seeds = torch.arange(lo, min(hi, lo + 15))
        a = whole.sample_from_nodes(NodeSamplerInput(None, seeds))
        b = DistributedSampler(ds, [-1, -1, -1], transport, layout).sample_from_nodes(NodeSamplerInput(None, seeds))
        assert set(a.node.tolist()) == set(b.node.tolist())
        assert _edges(a) == _edges(b)
        assert a.num_sampled_nodes == b.num_sampled_nodes


def test_one_request_per_remote_partition_per_hop_and_batch(ds, graphs):
    transports = _group(ds)
    loader = DistributedNeighborLoader(ds, [4, 4], transports[0], torch.arange(0, 60), batch_size=30,
                                       prefetch=0)
    g = graphs["dataset3"]
    for batch in loader:
        assert np.allclose(batch.x.numpy(), g.x[batch.n_id.numpy()])
        assert np.allclose(batch.weight.numpy(), g.weight[batch.e_id.numpy()])
    stats = loader.stats.snapshot()
    # per batch at most: 2 hops x 2 remote partitions (sampling) + 2 (features) + 2 (edge attributes)
    assert 0 < stats["requests"] <= 2 * (2 * 2 + 2 + 2)
    assert transports[0].calls == stats["requests"]


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


def _rpc_worker(rank: int, world_size: int, rdzv: str, url: str, out_dir: str) -> None:
    try:
        from training.process import start, stop
        from training.world import World

        world = World(rank, world_size, rank, rdzv)
        transport = start(world, timeout=60, use_rpc=True)
        ds = graphstore.open_dataset(url)
        PartitionServer(ds, rank).register(transport)
        torch.distributed.barrier()
        lo = int(ds.node_offsets()[rank])
        seeds = torch.arange(lo, lo + 12)
        sampler = DistributedSampler(ds, [-1, -1], transport, RankLayout(ds.num_parts, world_size))
        out = sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
        result = {"nodes": sorted(out.node.tolist()), "edges": [sorted(map(int, e)) for e in _edges(out)],
                  "requests": sampler.stats.snapshot()["requests"]}
        torch.distributed.barrier()
        stop(transport, graceful=True)
    except Exception:
        result = {"error": traceback.format_exc()}
    with open(f"{out_dir}/rank{rank}.json", "w") as fh:
        json.dump(result, fh)


@pytest.mark.distributed
def test_rpc_full_fanout_equals_single_process(tmp_path):
    import torch.multiprocessing as mp

    from tests.conftest import small_graph

    source, _ = small_graph(n=500, e=4000, seed=3)
    graphstore.ingest(source, tmp_path / "ds", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "ds")
    ctx = mp.spawn(_rpc_worker, args=(2, f"file://{tmp_path}/rdzv", str(tmp_path / "ds"), str(tmp_path)),
                   nprocs=2, join=False)
    join_spawned(ctx, 120)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in got, f"rank {rank} failed:\n{got.get('error')}"
        lo = int(ds.node_offsets()[rank])
        want = NeighborSampler(ds, [-1, -1]).sample_from_nodes(NodeSamplerInput(None, torch.arange(lo, lo + 12)))
        assert got["nodes"] == sorted(want.node.tolist())
        assert got["edges"] == [sorted(map(int, e)) for e in _edges(want)]
        assert got["requests"] >= 1
