"""Distributed sampling across partitions for heterogeneous and temporal graphs (loopback transport)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from sampling import NeighborSampler
from sampling.dist_loader import DistributedLinkNeighborLoader
from sampling.distributed import DistributedSampler, PartitionServer, RankLayout
from sampling.transport import LoopbackTransport
from tests.conftest import small_hetero


def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    data, _ = small_hetero(seed=4)
    dest = tmp_path_factory.mktemp("het") / "ds"
    graphstore.ingest(data, dest, num_parts=2)
    return graphstore.open_dataset(dest)


def test_hetero_full_fanout_distributed_equals_single_process(hetero):
    ds = hetero
    fanout = {et: [-1, -1] for et in ds.edge_types}
    whole = NeighborSampler(ds, fanout)
    for rank, transport in enumerate(_group(ds)):
        lo = int(ds.node_offsets("paper")[rank])
        seeds = NodeSamplerInput(None, torch.arange(lo, lo + 10), input_type="paper")
        a = whole.sample_from_nodes(seeds)
        b = DistributedSampler(ds, fanout, transport, RankLayout(2, 2)).sample_from_nodes(seeds)
        for ntype in ds.node_types:
            assert set(a.node[ntype].tolist()) == set(b.node[ntype].tolist()), ntype
        for et in ds.edge_types:
            assert set(a.edge[et].tolist()) == set(b.edge[et].tolist()), et
        assert transport.calls > 0


def test_temporal_links_across_partitions_never_look_ahead(tmp_path):
    from torch_geometric.data import Data

    rng = np.random.default_rng(0)
    n, e = 300, 4000
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    time = rng.integers(0, 1000, e)
    graphstore.ingest(Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=n,
                           time=torch.from_numpy(time)), tmp_path / "t", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "t")
    transports = _group(ds)
    for rank in range(2):
        loader = DistributedLinkNeighborLoader(ds, [5, 5], transports[rank], time_attr="time", batch_size=64,
                                               neg_sampling=dict(mode="binary", amount=1), prefetch=0, seed=rank)
        own = loader.edge_label_index if hasattr(loader, "edge_label_index") else None
        checked = 0
        for batch in loader:
            limit = batch.edge_label_time[batch.batch[batch.edge_index[1]]]
            assert (batch.time <= limit).all()
            checked += batch.time.numel()
        assert checked > 0 and transports[rank].calls > 0, own
