"""Sampler processes beside a rank: a distributed loader's batches sampled and gathered in N worker processes.

Each worker is forked at the rank's start, before the rank runs any thread (:func:`prefork`: a copy of
the rank with the modules it imported, where a spawned interpreter imports torch and PyG again, seconds of
CPU each). Later ones are never forked from the rank (by then it runs RPC and numba threads, whose locks a
fork would copy): they come from Python's fork server, one process a rank, started with the first of them,
that imports torch, PyG and the loaders once, single-threaded, and forks each worker from that
(``GRAPHSTORE_FORK_RANKS=0``: spawned, each a fresh interpreter). It opens the dataset itself
(memory-mapped: no copy) and rebuilds the rank's loader from its recipe. The rank draws the seed order
and sends each index batch, with the pass's stream number, to a worker; the worker samples and gathers
it and sends the batch back through blocks of shared memory it reuses (:mod:`sampling.loader.handoff`: its
rows are never pickled, and gathered where the rank reads them). A worker's requests to other ranks'
partitions are relayed by its rank, which alone is in the RPC group. The batches are those of the rank's
own threads for any N: each batch samples from a stream of its own. A worker dies with its rank (it
watches its parent), and a worker that dies ends the rank's pass with one line naming it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, NamedTuple

from graphstore.errors import GraphstoreError
from graphstore.forking import fork_allowed
from sampling.loader import handoff
from sampling.loader.device_feed import pin
from sampling.distributed.transport import PeerError, Transport

logger = logging.getLogger(__name__)
_POLL = 0.5  # seconds between checks that a worker (or the parent) is still alive
# what a sampler process imports before it builds a batch: the fork server imports it once for a rank's workers
_PRELOAD = ["torch", "torch_geometric", "sampling.distributed.dist_loader", __name__]
SLOTS = 2  # index batches in flight a worker: it builds one while its rank copies another out


class SamplerProcessLost(GraphstoreError, RuntimeError):
    """A sampler process died while building a batch; the message names it."""


class RelayTransport(Transport):
    """A sampler process's transport: its calls go to its rank over a pipe, and the rank makes them."""

    def __init__(self, rank: int, world_size: int, timeout: float, conn: Any) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._conn, self._send = conn, threading.Lock()
        self._pending: dict[int, Future] = {}
        self.asked_ids = itertools.count()
        self.calls = 0
        threading.Thread(target=self._answers, daemon=True, name="graphstore-relay-answers").start()

    def register(self, name: str, handler: Any) -> None:
        raise PeerError("a sampler process serves nothing: its rank serves the partitions")

    def call(self, peer: int, name: str, *args: Any) -> Future:
        future: Future = Future()
        with self._send:
            number = next(self.asked_ids)
            self._pending[number] = future
            self.calls += 1
            self._conn.send((number, peer, name, args))
        return future

    def _answers(self) -> None:
        while True:
            try:
                number, ok, value = self._conn.recv()
            except (EOFError, OSError):  # the rank is gone: the parent watch ends this process
                return
            future = self._pending.pop(number)
            future.set_result(value) if ok else future.set_exception(value)


def _relay(transport: Transport, conn: Any, lock: threading.Lock) -> None:
    """The rank's side of one worker's relay: make each call the worker asks for, send back the outcome."""

    def answer(number: int, future: Future) -> None:
        try:
            reply = (number, True, future.result())
        except Exception as exc:
            reply = (number, False, exc if isinstance(exc, PeerError) else PeerError(f"{type(exc).__name__}: {exc}"))
        with lock:
            try:
                conn.send(reply)
            except (OSError, ValueError):  # the worker is gone
                pass

    while True:
        try:
            number, peer, name, args = conn.recv()
        except (EOFError, OSError):
            return
        future = transport.call(peer, name, *args)
        future.add_done_callback(lambda f, n=number: answer(n, f))


class _Idle(NamedTuple):
    """A forked sampler process waiting for its recipe, and the rank's ends of its two pipes."""

    process: Any
    tasks: Any
    relay: Any


_FORKED: list[_Idle] = []  # forked by prefork, not yet given a loader


def prefork(count: int) -> int:
    """Fork sampler processes now until ``count`` wait idle, for the loaders this process builds later
    (a loader with N workers takes N of them before it spawns any). Call it before this process starts a
    thread: at a rank's start. Returns how many were forked: none where a thread other than the main one
    runs (a fork would copy the locks it holds), and the loaders spawn theirs then."""
    if count <= len(_FORKED) or threading.active_count() > 1:
        return 0
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    forked = 0
    while len(_FORKED) < count:
        tasks, theirs = ctx.Pipe()
        relay, relay_theirs = ctx.Pipe()
        rank_ends = [tasks, relay, *(c for idle in _FORKED for c in (idle.tasks, idle.relay))]
        process = ctx.Process(target=_idle_main, args=(theirs, relay_theirs, os.getpid(), rank_ends), daemon=True,
                              name=f"graphstore-sampler-idle-{len(_FORKED)}")
        process.start()
        theirs.close()
        relay_theirs.close()
        _FORKED.append(_Idle(process, tasks, relay))
        forked += 1
    return forked


def idle() -> int:
    """Sampler processes forked at this process's start and not yet given a loader (:func:`prefork`)."""
    return len(_FORKED)


def _idle_main(tasks: Any, relay: Any, parent: int, rank_ends: list[Any]) -> None:
    """A forked sampler process: wait for the recipe of a loader (the rank's end closing: it is gone), then
    serve it as a spawned one does."""
    for conn in rank_ends:  # the copies of the rank's ends: the rank's death must close the pipes
        conn.close()
    try:
        first = tasks.recv()
    except (EOFError, OSError):
        return
    if first is None:
        return
    recipe, rank, world_size, timeout, number = first
    _name(f"gs-sampler-{rank}-{number}")
    _worker_main(recipe, rank, world_size, timeout, tasks, relay, parent)


def _name(name: str) -> None:
    """What ``top`` and ``ps -o comm`` show for this process (15 bytes at most; Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def late_context(env: dict[str, str] | None = None) -> Any:
    """The multiprocessing context of the sampler processes not forked at the rank's start: Python's fork
    server (its processes forked from one that imported :data:`_PRELOAD` once) on Linux, spawn where
    ``GRAPHSTORE_FORK_RANKS=0`` asks for fresh interpreters or where there is no fork server."""
    import multiprocessing

    if not fork_allowed(env):  # a value other than 0 or 1 is refused there, in one line
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read once, when the server starts
    return ctx


def _watch_parent(parent: int) -> None:
    parent = parent or os.getppid()  # 0: whichever process forked this one (the fork server)
    while os.getppid() == parent:
        time.sleep(_POLL)
    os._exit(4)


def _worker_main(recipe: tuple, rank: int, world_size: int, timeout: float, tasks: Any, relay: Any,
                 parent: int) -> None:
    """A sampler process: rebuild the loader, then build each index batch it is sent until told to stop."""
    import torch
    import torch.multiprocessing  # noqa: F401  (tensors sent over a pipe travel in shared memory)

    from graphstore.dataset import rowmemory

    torch.set_num_threads(1)  # as torch's DataLoader workers: N workers' thread pools would crowd the rank's cores
    for name in ("graphstore", "sampling", "training"):  # rebuilding the loader repeats the rank's warnings
        logging.getLogger(name).setLevel(logging.ERROR)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="graphstore-parent-watch").start()
    cls, dataset, num_neighbors, seeds, kwargs, readers, cached = recipe
    if readers:  # the rank reads these arrays from disk past the page cache, its hot rows in shared memory: so here
        dataset.read_shared(readers)
    transport = RelayTransport(rank, world_size, timeout, relay)
    loader = cls(dataset, num_neighbors, transport, seeds, **kwargs)
    if cached is not None:  # the rows the rank's device cache holds (--gpu-cache) are left out of each batch
        loader.features.device_cache = cached
    sampler = getattr(loader, "node_sampler", None) or getattr(loader, "link_sampler", None)
    slabs = [None] * SLOTS  # the blocks batches are handed over in (none before a slot's first batch)
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        number, slot, stream, index = task
        slab = slabs[slot]
        try:
            sampler.set_epoch(stream)
            if slab is not None:
                slab.reset()
            with rowmemory.rows_into(slab):  # the stores gather the rows into the block
                out = loader.collate_fn(index)  # sampled (and gathered, when the loader filters per worker)
                batch = out if loader.filter_per_worker else loader.filter_fn(out)
            batch = handoff.pack(batch, slab)
            bigger = None  # a block the next batches fit in, sent with this batch, used from the next
            if slab is None or slab.wanted > slab.capacity:
                try:
                    bigger = handoff.Slab(handoff.wanted_block(slab.wanted if slab else handoff.tensor_bytes(batch)))
                except RuntimeError:  # no shared memory left for it: the batches travel as they are
                    bigger = None
            stats = loader.stats.snapshot(reset=True)
            stats["reads"] = dataset.reader_counts(reset=True) if readers else None  # counted as the rank's readers'
            stats["device_cache"] = cached.counts(reset=True) if cached is not None else None  # and its cache's
            tasks.send((number, True, batch, stats, None if bigger is None else bigger.block))
            slabs[slot] = bigger or slab
        except Exception as exc:  # delivered to the rank at this batch
            tasks.send((number, False, _picklable(exc), None, None))


def _picklable(exc: Exception) -> Exception:
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Worker:
    def __init__(self, ctx: Any, number: int, recipe: tuple, transport: Transport) -> None:
        self.number = number
        self.blocks: list[Any] = [None] * SLOTS  # its blocks of shared memory (sampling.loader.handoff), once sent
        self.sending, self.receiving = threading.Lock(), threading.Lock()
        self.answers: dict[int, tuple] = {}  # answers read by another slot's thread
        self.numbers = itertools.count()
        self.forked = bool(_FORKED)
        if self.forked:  # one forked at the rank's start: its recipe goes down the task pipe
            self.process, self.tasks, relay = _FORKED.pop(0)
            self.tasks.send((recipe, transport.rank, transport.world_size, transport.timeout, number))
        else:
            self.tasks, theirs = ctx.Pipe()
            relay, relay_theirs = ctx.Pipe()
            # a spawned worker is this process's child; one from the fork server is the server's, which ends
            # with this process: either way the worker watches its own parent
            parent = os.getpid() if ctx.get_start_method() == "spawn" else 0
            self.process = ctx.Process(
                target=_worker_main, name=f"graphstore-sampler-{transport.rank}-{number}", daemon=True,
                args=(recipe, transport.rank, transport.world_size, transport.timeout, theirs, relay_theirs, parent))
            self.process.start()
            theirs.close()
            relay_theirs.close()
        self._relay = threading.Thread(target=_relay, args=(transport, relay, threading.Lock()), daemon=True,
                                       name=f"graphstore-relay-{number}")
        self._relay.start()


class SamplerProcesses:
    """``count`` sampler processes for one loader (started on first use, kept for its later passes).

    :meth:`build` hands an index batch to an idle slot of a worker and waits for the batch; a rank's
    loader threads call it, ``SLOTS`` a worker (``LoaderThreads`` keeps the batches in order). A worker
    has ``SLOTS`` blocks and builds a batch into one while its rank copies the last out of another.
    """

    def __init__(self, recipe: tuple, count: int, transport: Transport, pinned: bool = False,
                 device_cache: Any = None) -> None:
        import torch.multiprocessing  # noqa: F401  (tensors sent over a pipe travel in shared memory)

        self.rank, self.pinned, self.device_cache = transport.rank, pinned, device_cache
        self.dataset = recipe[1]
        recipe = (*recipe, self.dataset.shared_readers(),  # the rank's disk tier, its RAM cache shared
                  device_cache.index() if device_cache is not None else None)
        ctx = late_context()
        self._workers = [_Worker(ctx, i, recipe, transport) for i in range(count)]
        self._idle: list[tuple[_Worker, int]] = [(w, slot) for slot in range(SLOTS) for w in self._workers][::-1]
        self._cond = threading.Condition()
        self.stats = None  # the loader's RemoteStats: the workers' remote traffic is added to it

    def build(self, stream: int, index: Any) -> Any:
        with self._cond:
            while not self._idle:
                self._cond.wait()
            worker, slot = self._idle.pop()
        try:
            with worker.sending:
                number = next(worker.numbers)
                worker.tasks.send((number, slot, stream, index))
            ok, value, stats, block = self._answer(worker, number)
            if ok:  # copied out of the slot's block before the worker may fill it again
                value = handoff.unpack(value, worker.blocks[slot], self.pinned)
            if block is not None:  # the slot's next batches come in this one
                worker.blocks[slot] = block
        finally:
            with self._cond:
                self._idle.append((worker, slot))
                self._cond.notify()
        if not ok:
            raise value
        if self.pinned:  # what did not travel in the block
            value = pin(value)
        if stats and self.stats is not None:
            self.stats.add(requests=int(stats["requests"]), wait=stats["wait_seconds"], rows=int(stats["rows"]))
        if stats and stats.get("reads"):
            self.dataset.add_reader_counts(stats["reads"])
        if stats and stats.get("device_cache") and self.device_cache is not None:
            self.device_cache.add(*stats["device_cache"])
        return value

    def _answer(self, worker: _Worker, number: int) -> tuple:
        """The worker's answer to task ``number`` (answers come in order; one read for the other slot's
        thread is left for it)."""
        while True:
            with worker.receiving:
                if number in worker.answers:
                    return worker.answers.pop(number)
                if worker.tasks.poll(_POLL):
                    try:
                        answer = worker.tasks.recv()
                    except (EOFError, OSError):  # its end of the pipe closed: it died
                        worker.process.join(2.0)
                        raise self._lost(worker) from None
                    if answer[0] == number:
                        return answer[1:]
                    worker.answers[answer[0]] = answer[1:]
                    continue
            if not worker.process.is_alive():
                raise self._lost(worker)

    def _lost(self, worker: _Worker) -> SamplerProcessLost:
        code = worker.process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return SamplerProcessLost(
            f"sampler process {worker.number} of rank {self.rank} (pid {worker.process.pid}) died ({how}) while "
            "building a batch; it was killed, or ran out of memory (fewer loader workers use less)")

    def close(self, timeout: float = 10.0) -> None:
        """Stop every worker: asked first, killed after ``timeout`` seconds."""
        for worker in self._workers:
            try:
                worker.tasks.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.process.join(max(0.1, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(1.0)
            worker.tasks.close()

    def alive(self) -> int:
        return sum(w.process.is_alive() for w in self._workers)
