"""Distributed sampling across partitions for heterogeneous and temporal graphs (loopback transport)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import DistributedSampler
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport
from tests.conftest import small_hetero


def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    data, expected = small_hetero(seed=4)
    dest = tmp_path_factory.mktemp("het") / "ds"
    graphstore.ingest(data, dest, num_parts=2)
    return graphstore.open_dataset(dest), expected


def _raw_edges_global(ds, expected) -> dict:
    """The input edge lists per type, in the dataset's global IDs (``orig_id`` maps back)."""
    from graphstore.dataset.whole import DatasetFeatureStore

    fs, to_global = DatasetFeatureStore(ds), {}
    for nt in ds.node_types:
        order = fs[nt, "orig_id", None].numpy()
        to_global[nt] = np.empty_like(order)
        to_global[nt][order] = np.arange(len(order))
    return {et: (to_global[et[0]][s], to_global[et[2]][d]) for et, (s, d) in expected.edges.items()}


def _oracle_hetero(edges: dict, seeds: dict, hops: int) -> tuple[dict, dict]:
    """Per edge type the edge IDs of the full ``hops``-hop neighbourhood of ``seeds`` (per node type),
    each hop expanding the nodes first reached in the previous one; and the nodes reached per type."""
    seen = {nt: set() for et in edges for nt in (et[0], et[2])}
    for nt, ids in seeds.items():
        seen[nt] |= set(ids.tolist())
    frontier = {nt: np.asarray(ids) for nt, ids in seeds.items()}
    out = {et: set() for et in edges}
    for _ in range(hops):
        new = {nt: set() for nt in seen}
        for et, (src, dst) in edges.items():
            picked = np.flatnonzero(np.isin(dst, frontier.get(et[2], [])))
            out[et] |= set(picked.tolist())
            new[et[0]] |= set(src[picked].tolist()) - seen[et[0]]
        for nt in seen:
            seen[nt] |= new[nt]
        frontier = {nt: np.array(sorted(ids), dtype=np.int64) for nt, ids in new.items()}
    return out, seen


def test_hetero_full_fanout_distributed_is_the_raw_neighbourhood(hetero):
    ds, expected = hetero
    edges = _raw_edges_global(ds, expected)
    fanout = {et: [-1, -1] for et in ds.edge_types}
    for rank, transport in enumerate(_group(ds)):
        lo = int(ds.node_offsets("paper")[rank])
        seeds = torch.arange(lo, lo + 10)
        b = DistributedSampler(ds, fanout, transport, RankLayout(2, 2)).sample_from_nodes(
            NodeSamplerInput(None, seeds, input_type="paper"))
        want_edges, want_nodes = _oracle_hetero(edges, {"paper": seeds.numpy()}, 2)
        for ntype in ds.node_types:
            got = b.node[ntype].tolist() if ntype in b.node else []
            assert sorted(got) == sorted(want_nodes[ntype]), ntype  # each node once
        for et in ds.edge_types:
            got = b.edge[et].tolist() if et in b.edge else []
            assert sorted(got) == sorted(want_edges[et]), et  # each edge once
            if len(got):
                src, dst = edges[et]
                node_s, node_d = b.node[et[0]].numpy(), b.node[et[2]].numpy()
                assert np.array_equal(node_s[b.row[et].numpy()], src[b.edge[et].numpy()]), et
                assert np.array_equal(node_d[b.col[et].numpy()], dst[b.edge[et].numpy()]), et
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
