"""A trainer's side of the sampler servers: its connections to them (:class:`SamplerServers`) and its
loaders (:class:`ServedLoader`), which draw the seed order here and have the batches built there.

The trainer finds the servers through their rendezvous (``HOST:PORT``, where server 0 hosts the servers'
store: each server publishes there the address it listens on), opens ``in_flight`` connections to each
and keeps a request on each of them: a batch goes to the server holding its first seed. A server
that closes a connection, or does not answer within ``timeout`` seconds, ends the trainer's pass with
:class:`ServerLost` naming it.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader

from graphstore.errors import GraphstoreError, InvalidInputError
from sampling.distributed.wire import WireStats
from sampling.loader.device_feed import pin
from sampling.loader.loader_threads import LoaderThreads
from sampling.loader.seed_order import compact_shuffle
from sampling.remote import frames, specs

SERVERS_KEY = "graphstore/serve/servers"  # in the servers' rendezvous store: how many servers there are


def server_key(rank: int) -> str:
    """The store key under which sampler server ``rank`` publishes the address trainers connect to."""
    return f"graphstore/serve/server/{rank}"


class ServerLost(GraphstoreError, ConnectionError):
    """A sampler server closed its connection or stopped answering; the message names it."""


class ServerFailed(GraphstoreError, RuntimeError):
    """A sampler server could not build what a trainer asked for; the message is the server's."""


def parse_address(address: str, flag: str = "--servers") -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInputError(f"{flag} {address!r}: give HOST:PORT, the address the sampler servers were started "
                                "with (graphstore serve --address)")
    return host.strip("[]"), int(port)


class _Server:
    def __init__(self, rank: int, address: str, sockets: list[socket.socket]) -> None:
        self.rank, self.address = rank, address
        self.idle = list(sockets)
        self.all = list(sockets)


class SamplerServers:
    """A trainer's connections to every sampler server of one address (``in_flight`` each).

    Examples
    --------
    >>> servers = SamplerServers("10.0.0.1:29600", timeout=120, job="j", trainer=0, trainers=1)  # doctest: +SKIP
    >>> servers.connect().manifest["name"]  # doctest: +SKIP
    'cora'
    """

    def __init__(self, address: str, timeout: float, job: str, trainer: int, trainers: int,
                 in_flight: int = 2) -> None:
        self.host, self.port = parse_address(address)
        self.address, self.timeout = address, float(timeout)
        self.job, self.trainer, self.trainers = str(job), int(trainer), int(trainers)
        self.in_flight = int(in_flight)
        self.token = uuid.uuid4().hex
        self.servers: list[_Server] = []
        self.hello: dict[str, Any] = {}
        self.wire = WireStats()  # bytes to and from each server, per request kind
        self._cond = threading.Condition()
        self._loaders = itertools.count()

    @property
    def manifest(self) -> dict[str, Any]:
        return self.hello["manifest"]

    def connect(self) -> SamplerServers:
        """Find the servers through their rendezvous and say hello on every connection (bounded by ``timeout``)."""
        addresses = self._addresses()
        for rank, address in enumerate(addresses):
            sockets = [self._dial(rank, address) for _ in range(self.in_flight)]
            server = _Server(rank, address, sockets)
            self.servers.append(server)
            for sock in sockets:
                fields, _ = self._ask(server, sock, "hello", {"token": self.token, "job": self.job,
                                                             "trainer": self.trainer, "trainers": self.trainers})
                self.hello = self.hello or fields
        return self

    def _addresses(self) -> list[str]:
        try:
            store = torch.distributed.TCPStore(self.host, self.port, is_master=False,
                                               timeout=timedelta(seconds=self.timeout))
            count = int(store.get(SERVERS_KEY))
            return [store.get(server_key(r)).decode() for r in range(count)]
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ServerLost(f"cannot reach the sampler servers at {self.address} within {self.timeout:.0f} s "
                             f"({first}); start them first (graphstore serve URL --address {self.address} ...), and "
                             "check the address and that this host reaches it") from None

    def _dial(self, rank: int, address: str) -> socket.socket:
        host, port = parse_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout)
        except OSError as exc:
            raise ServerLost(f"cannot connect to sampler server {rank} at {address} ({exc}); is that address "
                             "reachable from this host (graphstore serve --interface)?") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout)
        return sock

    # -- requests --

    def ask(self, server: int, kind: str, fields: dict[str, Any] | None = None,
            tensors: list[torch.Tensor] | tuple = ()) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """One request to server ``server`` on a free connection of its."""
        target = self.servers[server]
        sock = self._take(lambda: target if target.idle else None)
        try:
            return self._ask(target, sock, kind, fields, tensors)
        finally:
            self._give(target, sock)

    def ask_all(self, kind: str, fields: dict[str, Any] | None = None,
                tensors: list[torch.Tensor] | tuple = ()) -> list[tuple[dict[str, Any], list[torch.Tensor]]]:
        """The same request to every server, in server order."""
        return [self.ask(s.rank, kind, fields, tensors) for s in self.servers]

    def _take(self, pick: Callable[[], _Server | None]) -> socket.socket:
        with self._cond:
            while True:
                if not self.servers:
                    raise ServerLost("the connections to the sampler servers are closed")
                server = pick()
                if server is not None:
                    return server.idle.pop()
                self._cond.wait()

    def _give(self, server: _Server, sock: socket.socket) -> None:
        with self._cond:
            server.idle.append(sock)
            self._cond.notify()

    def _ask(self, server: _Server, sock: socket.socket, kind: str, fields: dict[str, Any] | None,
             tensors: list[torch.Tensor] | tuple = ()) -> tuple[dict[str, Any], list[torch.Tensor]]:
        started = time.monotonic()
        try:
            sent = frames.send(sock, kind, fields, tensors)
            answer, out_fields, out_tensors, received = frames.receive(sock)
        except socket.timeout:
            raise ServerLost(f"sampler server {server.rank} at {server.address} did not answer {kind!r} within "
                             f"{self.timeout:.0f} s (--timeout): it hangs, or its host or the network is down") from None
        except (frames.FrameError, OSError) as exc:
            raise ServerLost(f"lost sampler server {server.rank} at {server.address} during {kind!r} after "
                             f"{time.monotonic() - started:.1f} s ({exc}): it was killed or failed; its own log "
                             "says why") from None
        self.wire.add(server.rank, kind, sent, received)
        if answer == "error":
            raise ServerFailed(f"sampler server {server.rank} at {server.address}: {out_fields.get('error')}")
        return out_fields, out_tensors

    def open_loader(self, spec: dict[str, Any], tensors: list[torch.Tensor]) -> int:
        """Register a loader with every server; its number, for ``batch`` requests."""
        number = next(self._loaders)
        self.ask_all("open", {"loader": number, "spec": spec}, tensors)
        return number

    def close(self, finished: bool) -> None:
        """Say ``bye`` to every server when this trainer finished its job (``finished``), then hang up."""
        servers, self.servers = self.servers, []
        for server in servers:
            if finished and server.idle:
                with contextlib.suppress(GraphstoreError):
                    self._ask(server, server.idle[0], "bye", {})
            for sock in server.all:
                with contextlib.suppress(OSError):
                    sock.close()
        with self._cond:
            self._cond.notify_all()


class _Streams:
    """The served loader's pass numbers, kept as a ``NeighborSampler`` keeps them (``set_epoch`` by the
    training loop, ``next_epoch`` at each pass): the servers sample each batch from the stream its own
    loader would have drawn from, so the batches are those of the trainer's in-process loaders."""

    def __init__(self, seed: int | None) -> None:
        self._seed, self._epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def next_epoch(self) -> None:
        self._epoch += 1


def _positions(index: list[int]) -> torch.Tensor:
    return torch.tensor(index, dtype=torch.int64)


class ServedLoader(DataLoader):
    """A node or link loader whose batches sampler servers build: the trainer draws the order of its seeds
    (``shuffle``, ``drop_last``, ``batch_size``) and applies ``transform`` and pinning; ``in_flight`` batches
    are requested at once (default: two per server connection), ``prefetch`` more kept ready.

    Examples
    --------
    >>> loader = ServedLoader(servers, "node", [10, 5], seeds, batch_size=256, shuffle=True)  # doctest: +SKIP
    """

    def __init__(self, servers: SamplerServers, kind: str, fanout: Any, seeds: Any, *, batch_size: int = 1,
                 shuffle: bool = False, drop_last: bool = False, transform: Callable | None = None,
                 pin_memory: bool = False, loader_threads: int | None = None, prefetch: int = 2,
                 seed: int | None = None, **sampling: Any) -> None:
        unknown = sorted(set(sampling) - set(specs.SAMPLING) - set(specs.TENSORS) - {"neg_sampling", "message_edges"})
        if unknown:
            raise InvalidInputError(f"{', '.join(unknown)} cannot be honoured by a served loader; the arguments it "
                                    f"takes: {', '.join(sorted({*specs.SAMPLING, *specs.TENSORS, *specs.TRAINER}))}")
        ids = seeds[1] if isinstance(seeds, tuple) else seeds
        count = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else len(ids)
        super().__init__(range(count), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                         collate_fn=self._request)
        compact_shuffle(self, seed)
        self.servers, self.kind, self.transform, self.pinned = servers, kind, transform, bool(pin_memory)
        self.threads = loader_threads or servers.in_flight * len(servers.servers)
        self.prefetch = prefetch
        streams = _Streams(seed)
        setattr(self, "node_sampler" if kind == "node" else "link_sampler", streams)
        self._streams = streams
        self.skip_next = 0
        self._stream = 0
        self._route = self._router(seeds)
        spec, tensors = specs.encode(kind, fanout, seeds, {**sampling, "seed": seed})
        self.number = servers.open_loader(spec, tensors)

    def _request(self, index: list[int]) -> Any:
        server = self._route(index[0]) if index else 0
        fields, tensors = self.servers.ask(server, "batch", {"loader": self.number, "stream": self._stream},
                                           [_positions(index)])
        return frames.decode_batch(fields, tensors)

    def _router(self, seeds: Any) -> Callable[[int], int]:
        """Which server builds a batch: the one holding the partition of its first seed (node, or a link's
        source). A batch's neighbours come out in an order that depends on the rank sampling it, so a fixed
        server per batch keeps the batches independent of timing and of how many are in flight; the
        shuffled order spreads the batches over the servers, each sampling around nodes it holds."""
        from graphstore.dataset.rank_layout import RankLayout

        seed_type, ids = seeds if isinstance(seeds, tuple) else (None, seeds)
        ids = torch.as_tensor(ids)
        first = ids if ids.dim() == 1 else ids[0]  # node IDs, or the links' sources
        node_type = seed_type[0] if isinstance(seed_type, tuple) else seed_type
        manifest = self.servers.manifest
        offsets = torch.tensor({t["name"]: t["offsets"] for t in manifest["node_types"]}[node_type], dtype=torch.int64)
        layout = RankLayout(int(manifest["num_parts"]), len(self.servers.servers))
        server_of = torch.tensor([layout.server(p, self.servers.trainer) for p in range(layout.num_parts)],
                                 dtype=torch.int32)
        route = server_of[torch.searchsorted(offsets, first.contiguous(), right=True) - 1]  # 4 bytes a seed
        return lambda position: int(route[position])

    def filter_fn(self, batch: Any) -> Any:
        if self.transform is not None:
            batch = self.transform(batch)
        return pin(batch) if self.pinned else batch

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._streams.next_epoch()
        self._stream = self._streams._epoch
        base = super().__iter__()
        skip, self.skip_next = self.skip_next, 0
        for _ in range(skip):  # the order is drawn as in a whole pass; the skipped batches are not built
            base._next_index()

        def build(index: Any) -> Any:
            return self.filter_fn(self.collate_fn(index))

        return LoaderThreads(base._next_index, build, self.threads, self.prefetch, name="graphstore-served")


class ServedDataset:
    """What a trainer knows of the dataset its sampler servers serve: the manifest (types, attributes,
    splits, sizes), never a file. Anything that would read the data says where it runs instead."""

    def __init__(self, manifest: Any, url: str) -> None:
        self.manifest, self.url = manifest, url

    def __repr__(self) -> str:
        return f"ServedDataset({self.url!r}, name={self.name!r}, num_parts={self.num_parts})"

    name = property(lambda self: self.manifest.name)
    num_parts = property(lambda self: self.manifest.num_parts)
    is_hetero = property(lambda self: self.manifest.is_hetero)
    node_types = property(lambda self: [t.name for t in self.manifest.node_types])
    edge_types = property(lambda self: [t.name for t in self.manifest.edge_types])

    def num_nodes(self, ntype: Any = None) -> int:
        return self.manifest.node_type(ntype).num_nodes

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ServedOnlyError(f"Dataset.{name} reads the data, which this trainer does not hold: its sampler servers "
                              f"serve {self.url} (--servers); do it on a server, or train without --servers")


class ServedOnlyError(GraphstoreError, AttributeError):
    """A trainer of sampler servers asked for something only a process holding partitions has."""
