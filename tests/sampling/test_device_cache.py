"""The device feature cache: hits are never read from host memory, batches are the same as without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sampling.loader.gpu_cache import DeviceRowCache
from sampling.distributed.dist_loader import DistributedNeighborLoader
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport


@pytest.fixture(scope="module")
def ds(graphs):
    return graphs["dataset3"].data


def _batches(ds, transports, device=None, size=0, peers=(), reads=None):
    loader = DistributedNeighborLoader(ds, [4, 3], transports[0], torch.arange(0, 60), batch_size=20, seed=5,
                                       layout=RankLayout(3, 3))
    cache = None
    if size:
        cache = DeviceRowCache.hottest(ds, loader.features, (0,), size, device)
        loader.features.device_cache = cache
    if reads is not None:  # every x row read from a partition's store, here or on a peer
        for store in [loader.features.local, *peers]:
            get = store.get_tensor

            def spy(group, name, index=None, _get=get):
                if name == "x":
                    reads.setdefault("ids", []).extend(torch.as_tensor(index).view(-1).tolist())
                return _get(group, name, index)
            store.get_tensor = spy
    out = [cache.assemble(b.to(cache.device)) if cache else b for b in loader]
    return out, cache


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batches_are_the_same_and_hits_never_read(ds, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    transports = LoopbackTransport.group(3)
    servers = [PartitionServer(ds, r) for r in range(3)]
    for t, s in zip(transports, servers):
        s.register(t)
    plain, _ = _batches(ds, transports)
    reads: dict = {}
    row_bytes = 4 * ds.manifest.node_types[0].attrs["x"].shape[0]
    peers = [s.stores[s.parts[0]][0] for s in servers[1:]]
    cached, cache = _batches(ds, transports, device, 40 * row_bytes, peers, reads)
    assert len(cache.ids) == 40
    for a, b in zip(plain, cached):
        assert torch.equal(a.n_id, b.n_id.cpu()) and torch.equal(a.x, b.x.cpu()) and torch.equal(a.y, b.y.cpu())
        assert b.x.device.type == device
    snap = cache.snapshot()
    assert snap["hits"] > 0 and snap["hits"] + snap["misses"] == sum(len(b.n_id) for b in plain)
    assert not set(reads["ids"]) & set(cache.ids.tolist()), "a cached row was read from host memory"


def test_the_hottest_rows_are_the_most_drawn_sources(ds):
    transports = LoopbackTransport.group(3)
    for r, t in enumerate(transports):
        PartitionServer(ds, r).register(t)
    loader = DistributedNeighborLoader(ds, [4], transports[0], torch.arange(0, 10), batch_size=10,
                                       layout=RankLayout(3, 3))
    cache = DeviceRowCache.hottest(ds, loader.features, (0,), 10 * 4 * ds.manifest.node_types[0].attrs["x"].shape[0],
                                   "cpu")
    _, indices, _ = ds.partition(0)[1].csc_arrays()
    counts = np.bincount(np.asarray(indices), minlength=ds.num_nodes())
    assert counts[cache.ids].min() >= np.sort(counts)[-10]  # the 10 sources drawn most by partition 0's nodes
    assert torch.equal(cache.rows, loader.features[None, "x", torch.from_numpy(cache.ids)])
