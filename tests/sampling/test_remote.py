"""Sampler servers and their trainers' loaders, in one process: the frames, the specs, and batches that are
those of the trainer's own distributed loader whichever server builds them."""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from graphstore.dataset.linksplit import LinkSplit
from graphstore.dataset.rank_layout import RankLayout
from graphstore.errors import GraphstoreError
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader, local_seeds
from sampling.distributed.dist_sampler import RemoteStats
from sampling.distributed.server import PartitionServer
from sampling.distributed.transport import LoopbackTransport
from sampling.remote import frames, specs
from sampling.remote.client import SERVERS_KEY, SamplerServers, ServedLoader, ServerLost, server_key
from sampling.remote.sampler_server import SamplerServer, ServedPartitions


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_a_frame_carries_tensors_of_every_dtype_and_json_fields_unchanged():
    a, b = _pair()
    tensors = [torch.arange(5, dtype=torch.int64), torch.rand(3, 2), torch.tensor([True, False, True]),
               torch.empty(0, 4), torch.arange(6, dtype=torch.uint8).view(2, 3), torch.rand(2).to(torch.bfloat16)]
    sent = frames.send(a, "batch", {"loader": 3, "nested": {"k": [1, None]}}, tensors)
    kind, fields, got, size = frames.receive(b)
    assert (kind, fields, size) == ("batch", {"loader": 3, "nested": {"k": [1, None]}}, sent)
    for want, have in zip(tensors, got):
        assert have.dtype == want.dtype and have.shape == want.shape and torch.equal(have, want)


def test_something_that_is_not_a_frame_is_refused_before_any_allocation():
    a, b = _pair()
    a.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + bytes(32))
    with pytest.raises(frames.FrameError, match="not a graphstore sampler frame"):
        frames.receive(b)
    c, d = _pair()
    c.close()
    with pytest.raises(frames.FrameError, match="closed the connection"):
        frames.receive(d)


def test_a_heterogeneous_batch_comes_back_with_its_types_and_attributes():
    from torch_geometric.data import HeteroData

    batch = HeteroData()
    batch["paper"].x = torch.rand(4, 3)
    batch["paper"].batch_size = 2
    batch["author"].n_id = torch.arange(3)
    batch["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [2, 3]])
    batch["author", "writes", "paper"].num_sampled_edges = [2, 0]
    fields, tensors = frames.encode_batch(batch)
    a, b = _pair()
    frames.send(a, "batch", fields, tensors)
    _, fields, tensors, _ = frames.receive(b)
    back = frames.decode_batch(fields, tensors)
    assert back.node_types == batch.node_types and back.edge_types == batch.edge_types
    assert torch.equal(back["paper"].x, batch["paper"].x) and back["paper"].batch_size == 2
    assert back["author", "writes", "paper"].num_sampled_edges == [2, 0]


def test_a_batch_attribute_that_cannot_travel_is_named():
    from torch_geometric.data import Data

    with pytest.raises(GraphstoreError, match="'note' holds a object"):
        frames.encode_batch(Data(x=torch.rand(2, 2), note=object()))


def test_a_loader_spec_crosses_as_it_was_given():
    from sampling.graph.edgemask import MessageEdges

    fanout = {("a", "to", "b"): [3, 2], ("b", "to", "a"): [1, 1]}
    options = {"replace": True, "seed": 7, "edge_label_time": torch.arange(4),
               "message_edges": MessageEdges(("a", "to", "b"), (0, 1)), "neg_sampling": {"mode": "binary", "amount": 2}}
    fields, tensors = specs.encode("link", fanout, (("a", "to", "b"), torch.zeros(2, 4, dtype=torch.int64)), options)
    kind, fanout_back, seeds, back = specs.decode(fields, tensors)
    assert kind == "link" and fanout_back == fanout and seeds[0] == ("a", "to", "b")
    assert back["message_edges"] == options["message_edges"] and back["seed"] == 7 and back["replace"] is True
    assert back["neg_sampling"] == {"mode": "binary", "amount": 2.0}
    assert torch.equal(back["edge_label_time"], torch.arange(4))
    with pytest.raises(GraphstoreError, match="option 'transform'"):
        specs.decode({**fields, "options": {"transform": 1}}, tensors)
    # a split computed by ingest's rules (no stored one) crosses as its rule, which the servers apply
    rule = LinkSplit((0.7, 0.2, 0.1), "time", ("a", "to", "b"), seed=5, time_attr="t")
    ruled = {"message_edges": MessageEdges(("a", "to", "b"), (0,), rule)}
    back = specs.decode(*specs.encode("link", [2], torch.zeros(2, 3, dtype=torch.int64), ruled)[:2])[3]
    assert back["message_edges"] == ruled["message_edges"] and back["message_edges"].rule == rule


@contextlib.contextmanager
def _servers(ds, workers=(0, 0, 0)):
    """Three sampler servers in this process, one per partition of the 3-partition dataset ``ds`` (server
    ``i`` with ``workers[i]`` sampler processes), found through a rendezvous store as trainers find them."""
    transports = LoopbackTransport.group(ds.num_parts)
    layout = RankLayout(ds.num_parts, ds.num_parts)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    servers = []
    try:
        for rank, t in enumerate(transports):
            PartitionServer(ds, rank).register(t)
            part = layout.parts_of(rank)

            def seeds(fields, part=part, rank=rank):
                return [local_seeds(ds, part, fields.get("mask"), layout, rank)]

            served_parts = ServedPartitions(ds, t, layout, RemoteStats(), seeds, lambda: [], workers[rank])
            servers.append(SamplerServer(served_parts, "127.0.0.1").start())
            store.set(server_key(rank), servers[-1].address)
        store.set(SERVERS_KEY, str(len(servers)))
        yield ds, transports, f"127.0.0.1:{store.port}", servers
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def served(graphs):
    """Three sampler servers in this process; yields (dataset, transports, address, servers)."""
    with _servers(graphs["dataset3"].data) as out:
        yield out


def _batches(loader, passes=2):
    out = []
    for epoch in range(passes):
        loader.node_sampler.set_epoch(1000 * (epoch + 1)) if hasattr(loader, "node_sampler") else \
            loader.link_sampler.set_epoch(1000 * (epoch + 1))
        loader.sampler.generator = torch.Generator().manual_seed(epoch)
        out.extend(list(loader))
    return out


def _same(want, got):
    assert len(want) == len(got)
    for a, b in zip(want, got):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            va, vb = a[key], b[key]
            assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb, key


def test_served_batches_are_those_of_the_distributed_loader_of_the_server_holding_their_seeds(served):
    ds, transports, address, servers = served
    lo, hi = ds.node_offsets()[1:3]
    seeds = torch.arange(int(lo), int(hi), 2)  # every seed in partition 1: server 1 builds every batch
    kwargs = dict(batch_size=16, shuffle=True, seed=5)
    local = DistributedNeighborLoader(ds, [4, 3], transports[1], seeds, layout=RankLayout(3, 3), prefetch=0, **kwargs)
    client = SamplerServers(address, timeout=30, job="j", trainer=0, trainers=1).connect()
    try:
        remote = ServedLoader(client, "node", [4, 3], seeds, prefetch=1, **kwargs)
        _same(_batches(local), _batches(remote))
        assert [s.batches for s in servers] == [0, 2 * len(local), 0]
        assert client.wire.snapshot()  # the bytes of every request are counted
    finally:
        client.close(finished=True)


def test_a_server_with_sampler_processes_serves_the_batches_its_threads_would(graphs):
    """``graphstore serve --loader-workers 1``: server 1 builds the batches in a sampler process (which asks
    the other servers for remote neighbours through it), the same batches as with its connections' threads."""
    ds = graphs["dataset3"].data
    lo, hi = ds.node_offsets()[1:3]
    seeds = torch.arange(int(lo), int(hi), 3)  # every seed in partition 1: server 1 builds every batch
    got = []
    for workers in ((0, 0, 0), (0, 1, 0)):
        with _servers(ds, workers) as (_, _, address, servers):
            client = SamplerServers(address, timeout=60, job="j", trainer=0, trainers=1).connect()
            try:
                loader = ServedLoader(client, "node", [4, 3], seeds, batch_size=16, shuffle=True, seed=5, prefetch=1)
                got.append(_batches(loader))
                entry = next(iter(servers[1]._entries.values()))
                assert (entry.pool is not None) == bool(workers[1])
            finally:
                client.close(finished=True)
    _same(*got)


def test_served_batches_do_not_depend_on_how_many_are_in_flight(served):
    _, _, address, servers = served
    seeds = torch.arange(0, 400, 3)
    client = SamplerServers(address, timeout=30, job="j", trainer=0, trainers=1, in_flight=3).connect()
    try:
        one, many = (ServedLoader(client, "node", [4, 3], seeds, batch_size=8, shuffle=True, seed=9,
                                  loader_threads=n, prefetch=0 if n == 1 else 4) for n in (1, 9))
        _same(_batches(one), _batches(many))
        assert min(s.batches for s in servers) > 0  # every server built some
    finally:
        client.close(finished=True)


def test_served_link_batches_are_those_of_the_distributed_link_loader(served):
    ds, transports, address, _ = served
    lo = int(ds.node_offsets()[2])
    index = torch.stack([torch.arange(lo, lo + 60), torch.arange(1, 61)])  # sources in partition 2
    kwargs = dict(batch_size=8, shuffle=True, seed=3, neg_sampling={"mode": "binary", "amount": 1})
    local = DistributedLinkNeighborLoader(ds, [3], transports[2], index, layout=RankLayout(3, 3), prefetch=0, **kwargs)
    client = SamplerServers(address, timeout=30, job="j", trainer=0, trainers=1).connect()
    try:
        remote = ServedLoader(client, "link", [3], index, **kwargs)
        for a, b in zip(_batches(local, 1), _batches(remote, 1)):
            assert torch.equal(a.edge_label_index, b.edge_label_index) and torch.equal(a.n_id, b.n_id)
            assert torch.equal(a.x, b.x) and torch.equal(a.edge_label, b.edge_label)
    finally:
        client.close(finished=True)


def test_a_job_ends_on_the_servers_when_its_trainers_leave_and_says_how(served):
    _, _, address, servers = served
    done = SamplerServers(address, timeout=30, job="ok", trainer=0, trainers=1).connect()
    done.close(finished=True)
    assert [s.wait(timeout=10) for s in servers] == [(0, "the 1 trainer(s) of job ok finished")] * 3
    lost = SamplerServers(address, timeout=30, job="bad", trainer=1, trainers=2).connect()
    lost.close(finished=False)
    code, what = servers[0].wait(timeout=10)
    assert code == 1 and "trainer rank(s) [0, 1] of job bad left without finishing" in what


def test_a_server_that_hangs_up_is_named_by_the_trainer(served):
    ds, _, address, servers = served
    lo = int(ds.node_offsets()[1])
    client = SamplerServers(address, timeout=30, job="j", trainer=0, trainers=1).connect()
    try:
        loader = ServedLoader(client, "node", [2], torch.arange(lo, lo + 30), batch_size=5, prefetch=0)
        servers[1].close()  # the server holding these seeds
        with pytest.raises(ServerLost, match=r"lost sampler server 1 at 127\.0\.0\.1:\d+ during 'batch'"):
            list(loader)
    finally:
        client.close(finished=False)


def test_nothing_listening_at_the_address_is_one_line_naming_it():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ServerLost, match=f"cannot reach the sampler servers at 127.0.0.1:{port} within 1 s"):
        SamplerServers(f"127.0.0.1:{port}", timeout=1, job="j", trainer=0, trainers=1).connect()
