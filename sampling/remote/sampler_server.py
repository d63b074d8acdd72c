"""A sampler server: serves sampled batches with their features to trainers that hold no partition.

It is one rank of the servers' own job (their partitions, RPC between them, as training ranks have) and
listens on a TCP port of its own for trainers. A trainer opens a few connections to every server
(:mod:`sampling.remote.client`), says who it is (``hello``: its job, its rank, the job's trainer count),
asks for its seeds (``seeds``: each server resolves a mask or a link split on its partitions), registers a
loader with its seeds on every server (``open``) and then sends index batches (``batch``: positions into
those seeds and the pass's stream number), which any server samples and gathers as the trainer's own
distributed loader would (:mod:`sampling.distributed.dist_loader`), so the batches do not depend on which
server built them. Each connection has a thread; the batches of several connections are built at once
(the kernels and gathers release the GIL), or in ``loader_workers`` sampler processes per loader. When
every connection of a trainer has closed, its loaders are dropped; when every trainer of a job has gone,
the job is over: :meth:`SamplerServer.wait` returns 0 when each said ``bye``, 1 when one left without.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from graphstore.errors import GraphstoreError
from sampling.remote import frames, specs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedPartitions:
    """What a sampler server serves from: its rank's dataset, transport and layout (as a training rank has
    them), and the resolution of seed requests on its partitions."""

    dataset: Any
    transport: Any
    layout: Any
    stats: Any
    seeds: Callable[[dict[str, Any]], list[torch.Tensor]]  # this server's share of the seeds a request names
    labels: Callable[[], dict[str, int]]  # the largest label of each labelled node type on its partitions
    loader_workers: int = 0  # sampler processes per loader (0: the connections' threads build the batches)
    # what a failed request tells the trainer: a lost peer server named with its host (``graphstore serve``)
    explain: Callable[[BaseException], BaseException] = lambda exc: exc

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def servers(self) -> int:
        return self.transport.world_size


class _Entry:
    """A trainer's loader on this server: the distributed loader its batches come from, and the stream its
    current pass draws from (connections asking for another stream wait until the batches in flight end)."""

    def __init__(self, loader: Any, pool: Any) -> None:
        self.loader, self.pool = loader, pool
        self.cond = threading.Condition()
        self.stream: int | None = None
        self.active = 0

    @contextlib.contextmanager
    def streaming(self, stream: int) -> Any:
        with self.cond:
            while self.active and self.stream != stream:
                self.cond.wait()
            if self.stream != stream:
                self.sampler.set_epoch(stream)
                self.stream = stream
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "node_sampler", None) or getattr(self.loader, "link_sampler", None)

    def build(self, stream: int, index: torch.Tensor) -> Any:
        if self.pool is not None:
            return self.pool.build(stream, index)
        with self.streaming(stream):
            out = self.loader.collate_fn(index)
            return self.loader.filter_fn(out)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


@dataclass
class _Job:
    trainers: int
    connections: int = 0
    said_bye: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)


@dataclass
class _Connection:
    peer: str
    token: str | None = None
    job: str | None = None
    trainer: int = -1


class SamplerServer:
    """Listens on ``host`` (a free port) for trainers and serves them from ``served`` until :meth:`close`.

    Examples
    --------
    >>> server = SamplerServer(served, "10.0.0.2")  # doctest: +SKIP
    >>> server.start(); code = server.wait()  # doctest: +SKIP
    """

    def __init__(self, served: ServedPartitions, host: str, keep_serving: bool = False) -> None:
        self.served, self.keep_serving = served, keep_serving
        self._listener = socket.create_server((host, 0), backlog=256)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._tokens: dict[str, int] = {}  # open connections per trainer process
        self._jobs: dict[str, _Job] = {}
        self._sockets: set[socket.socket] = set()
        self._ended: queue.Queue[tuple[int, str]] = queue.Queue()
        self._closed = False
        self.batches = 0

    def start(self) -> SamplerServer:
        threading.Thread(target=self._accept, daemon=True, name="graphstore-serve-accept").start()
        return self

    def wait(self, timeout: float | None = None) -> tuple[int, str] | None:
        """Block until the job served ends (``(exit code, what happened)``), or ``timeout`` seconds pass."""
        try:
            return self._ended.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, entries = list(self._sockets), list(self._entries.values())
            self._entries.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for entry in entries:
            entry.close()

    # -- connections --

    def _accept(self) -> None:
        numbers = itertools.count()
        while not self._closed:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.add(sock)
            threading.Thread(target=self._serve, args=(sock, _Connection(f"{peer[0]}:{peer[1]}")), daemon=True,
                             name=f"graphstore-serve-{next(numbers)}").start()

    def _serve(self, sock: socket.socket, conn: _Connection) -> None:
        try:
            while True:
                kind, fields, tensors, _ = frames.receive(sock)
                try:
                    out_kind, out_fields, out_tensors = self._answer(conn, kind, fields, tensors)
                except Exception as exc:  # delivered to the trainer, which ends naming this server
                    if not isinstance(exc, GraphstoreError):
                        logger.exception("sampler server %d: %s from %s failed", self.served.rank, kind, conn.peer)
                    told = self.served.explain(exc)
                    out_kind, out_fields, out_tensors = "error", {"error": f"{type(told).__name__}: {told}"}, []
                frames.send(sock, out_kind, out_fields, out_tensors)
        except (frames.FrameError, OSError):
            pass  # the trainer closed the connection, or is gone
        finally:
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()
            self._left(conn)

    def _answer(self, conn: _Connection, kind: str, fields: dict[str, Any],
                tensors: list[torch.Tensor]) -> tuple[str, dict[str, Any], list[torch.Tensor]]:
        if kind == "hello":
            return self._hello(conn, fields)
        if conn.token is None:
            raise GraphstoreError(f"a trainer sent {kind!r} before hello")
        if kind == "batch":
            entry = self._entry(conn.token, int(fields["loader"]))
            batch = entry.build(int(fields["stream"]), tensors[0])
            out_fields, out_tensors = frames.encode_batch(batch)
            self.batches += 1
            return "batch", out_fields, out_tensors
        if kind == "seeds":
            return "seeds", {}, self.served.seeds(fields)
        if kind == "open":
            self._open(conn.token, int(fields["loader"]), fields["spec"], tensors)
            return "opened", {}, []
        if kind == "labels":
            return "labels", {"largest": self.served.labels()}, []
        if kind == "bye":
            with self._lock:
                self._jobs[conn.job].said_bye.add(conn.trainer)
            return "bye", {}, []
        raise GraphstoreError(f"a trainer sent an unknown request {kind!r}")

    def _hello(self, conn: _Connection, fields: dict[str, Any]) -> tuple[str, dict[str, Any], list[torch.Tensor]]:
        conn.token, conn.job, conn.trainer = str(fields["token"]), str(fields["job"]), int(fields["trainer"])
        trainers = int(fields["trainers"])
        with self._lock:
            self._tokens[conn.token] = self._tokens.get(conn.token, 0) + 1
            job = self._jobs.setdefault(conn.job, _Job(trainers))
            job.connections += 1
            job.seen.add(conn.trainer)
        ds = self.served.dataset
        return "hello", {"manifest": ds.manifest.to_json(), "url": ds.url, "server": self.served.rank,
                         "servers": self.served.servers}, []

    def _left(self, conn: _Connection) -> None:
        if conn.token is None:
            return
        with self._lock:
            self._tokens[conn.token] -= 1
            dropped = []
            if not self._tokens[conn.token]:  # the trainer process is gone: its loaders go too
                del self._tokens[conn.token]
                dropped = [k for k in self._entries if k[0] == conn.token]
            entries = [self._entries.pop(k) for k in dropped]
            job = self._jobs[conn.job]
            job.connections -= 1
            over = job.connections == 0
            if over:
                del self._jobs[conn.job]
        for entry in entries:
            entry.close()
        if over:
            self._job_over(conn.job, job)

    def _job_over(self, name: str, job: _Job) -> None:
        missing = sorted(set(range(job.trainers)) - job.said_bye)
        if missing:
            what = (f"trainer rank(s) {missing} of job {name} left without finishing (failed or killed); their "
                    "loaders were dropped")
        else:
            what = f"the {job.trainers} trainer(s) of job {name} finished"
        if self.keep_serving:
            logger.warning("sampler server %d: %s; serving the next job", self.served.rank, what)
        else:
            self._ended.put((1 if missing else 0, what))

    # -- loaders --

    def _entry(self, token: str, number: int) -> _Entry:
        with self._lock:
            entry = self._entries.get((token, number))
        if entry is None:
            raise GraphstoreError(f"loader {number} was not opened on sampler server {self.served.rank}")
        return entry

    def _open(self, token: str, number: int, spec: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader

        kind, fanout, seeds, options = specs.decode(spec, tensors)
        s = self.served
        common = dict(layout=s.layout, stats=s.stats, batch_size=1, loader_threads=1, prefetch=0,
                      filter_per_worker=False)
        if kind == "node":
            loader = DistributedNeighborLoader(s.dataset, fanout, s.transport, seeds, **common, **options)
        else:
            loader = DistributedLinkNeighborLoader(s.dataset, fanout, s.transport, edge_label_index=seeds, **common,
                                                   **options)
        pool = None
        if s.loader_workers:
            from sampling.loader.neighbor_loader import process_pool

            pool = process_pool(loader, s.loader_workers)
        with self._lock:
            old = self._entries.pop((token, number), None)
            self._entries[(token, number)] = _Entry(loader, pool)
        if old is not None:
            old.close()
