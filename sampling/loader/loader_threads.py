"""The loader's threads: N threads sample and gather index batches, handed to the consumer in order.

Each thread takes the next index batch (in order, under a lock), builds it (``collate_fn``: sampling,
``filter_fn``: feature gather) and leaves it in a reorder buffer; the consumer takes batch after batch
in order. At most ``depth + threads`` batches are in flight (drawn and not yet taken), so memory is
bounded whatever the speed of the consumer (and with :class:`RowsAhead`, the rows the batches ahead of
it gather). The numba kernels and torch's gathers release the GIL, so
the threads sample and gather on several cores; with ``seed=`` set each batch draws from a stream of
its own (``NeighborSampler._batch_stream``), so the batches do not depend on the number of threads.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Iterator

import torch

from graphstore.errors import InvalidInputError

_END = object()
_OPENMP = "OpenMP" in torch.__config__.parallel_info()  # torch's intra-op threads are per calling thread


def serial_torch_ops() -> None:
    """The calling thread runs torch's CPU ops by itself, with no team of intra-op threads. Loader
    threads do: their parallelism is their own, and an OpenMP team for each oversubscribes the cores (a
    team's threads spin-wait between ops; on a shared 2-core machine one loader thread with a team of 2
    made 10-50 batches/s, alone 44-65, on tools/bench_loader.py's graph). Under OpenMP the count is per
    thread, so the training loop keeps its own (:class:`LoaderThreads` fixes it first); torch also takes
    the last count set as the one threads started later begin with. Other backends share one pool of
    threads: left alone."""
    if _OPENMP:
        torch.set_num_threads(1)


class _Failed:
    """What building a batch (or drawing its indices) raised, delivered in that batch's place."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class RowsAhead:
    """A bound on the rows the batches built ahead of the consumer hold: each batch is made in two steps,
    ``make`` (sampling: small) then ``finish`` (the feature gather: a row per sampled node), and between
    them a batch whose ``rows_of`` would take the rows held ahead past ``limit`` waits until it fits (a batch
    ahead was taken) or until the consumer waits for it: then it is not ahead of anything, and is built as
    without threads. ``limit=0``: no batch is gathered ahead; its sampling still is."""

    __slots__ = ("finish", "rows_of", "limit")

    def __init__(self, finish: Callable[[Any], Any], rows_of: Callable[[Any], int], limit: int) -> None:
        self.finish, self.rows_of, self.limit = finish, rows_of, limit


class _Shared:
    """What the threads and the consumer share. Threads hold this, never the iterator, so an iterator
    nobody holds any more is garbage-collected and its finaliser stops them."""

    def __init__(self, next_index: Callable[[], Any], make: Callable[[Any], Any] | None, limit: int,
                 ahead: RowsAhead | None = None) -> None:
        self.cond = threading.Condition()
        self.next_index, self.make, self.limit, self.ahead = next_index, make, limit, ahead
        self.claimed = 0  # index batches drawn (tickets handed out, in order)
        self.taken = 0  # batches the consumer took
        self.end: int | None = None  # the ticket no batch is drawn for (the source ran out, or failed before it)
        self.ready: dict[int, Any] = {}  # ticket -> batch (or _Failed), built and not yet taken
        self.stopped = False
        self.held: dict[int, int] = {}  # ticket -> rows of a batch admitted by ``ahead`` and not yet taken
        self.waiting: int | None = None  # the ticket the consumer waits for

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.ready.clear()
            self.held.clear()
            self.cond.notify_all()

    def admit(self, ticket: int, rows: int) -> None:
        """Wait until ``rows`` more fit under ``ahead.limit`` beside the rows held ahead, or the consumer waits
        for this very batch (or the pass stopped); then count them as held until the batch is taken."""
        with self.cond:
            while not self.stopped and self.waiting != ticket and sum(self.held.values()) + rows > self.ahead.limit:
                self.cond.wait()
            self.held[ticket] = rows

    def took(self, ticket: int) -> None:
        """The consumer took ``ticket``: its rows are its own now, not ahead (the caller holds ``cond``)."""
        self.taken = ticket + 1
        self.held.pop(ticket, None)
        self.cond.notify_all()  # room for one more batch, and for its rows

    def claim(self) -> tuple[int, Any] | None:
        """The next ticket and its index batch, once fewer than ``limit`` batches are in flight;
        ``None`` when the pass is over (or stopped). Drawing under the lock keeps tickets in index order."""
        with self.cond:
            while not self.stopped and self.end is None and self.claimed - self.taken >= self.limit:
                self.cond.wait()
            if self.stopped or self.end is not None:
                return None
            ticket = self.claimed
            try:
                index = self.next_index()
            except StopIteration:
                self.end = ticket
                self.cond.notify_all()
                return None
            except BaseException as exc:  # the index source broke: the consumer gets it in this batch's place
                self.ready[ticket], self.claimed, self.end = _Failed(exc), ticket + 1, ticket + 1
                self.cond.notify_all()
                return None
            self.claimed = ticket + 1
            return ticket, index

    def deliver(self, ticket: int, item: Any) -> None:
        with self.cond:
            if not self.stopped:
                self.ready[ticket] = item
            if isinstance(item, _Failed) and (self.end is None or self.end > ticket + 1):
                self.end = ticket + 1  # no batch after a failed one is drawn
            self.cond.notify_all()


def _work(shared: _Shared) -> None:
    serial_torch_ops()
    while True:
        claim = shared.claim()
        if claim is None:
            return
        ticket, index = claim
        try:
            item = shared.make(index) if shared.make is not None else index
            if shared.ahead is not None:  # sampled: gather its rows once they fit beside those held ahead
                shared.admit(ticket, shared.ahead.rows_of(item))
                item = shared.ahead.finish(item)
        except BaseException as exc:  # delivered to the consumer
            item = _Failed(exc)
        shared.deliver(ticket, item)
        del item, index  # a thread waiting for room holds no batch


class LoaderThreads:
    """Batches built by ``threads`` threads, handed out in order: ``make(next_index())`` for each index
    batch until ``next_index`` raises ``StopIteration``.

    At most ``depth + threads`` batches are in flight; with ``ahead`` (:class:`RowsAhead`), the rows of those
    ahead of the consumer are bounded too. Each thread runs torch's ops by itself
    (:func:`serial_torch_ops`). Errors are re-raised in the consumer at the batch that raised them (the
    batches before it come first); ``close`` stops and joins the threads
    (each finishes the batch it is on), as does garbage collection (without the join); a finished
    iterator keeps raising ``StopIteration``.

    Examples
    --------
    >>> squares = iter([[1, 2], [3]])
    >>> list(LoaderThreads(squares.__next__, lambda idx: [i * i for i in idx], threads=2))
    [[1, 4], [9]]
    """

    def __init__(self, next_index: Callable[[], Any], make: Callable[[Any], Any] | None, threads: int = 1,
                 depth: int = 0, name: str = "graphstore-loader", ahead: RowsAhead | None = None) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(f"threads={threads!r}: give an integer >= 1")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise InvalidInputError(f"depth={depth!r}: give an integer >= 0")
        torch.get_num_threads()  # under OpenMP this fixes the consumer's own count now, before the threads set theirs
        self._shared = _Shared(next_index, make, depth + threads, ahead)
        self._finished = False
        self._threads = [threading.Thread(target=_work, args=(self._shared,), daemon=True, name=f"{name}-{i}")
                         for i in range(threads)]
        self._finalizer = weakref.finalize(self, self._shared.stop)
        for thread in self._threads:
            thread.start()

    def __iter__(self) -> LoaderThreads:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        shared = self._shared
        with shared.cond:
            if shared.taken not in shared.ready:
                shared.waiting = shared.taken  # a batch waiting for room ahead is built now: it is not ahead
                shared.cond.notify_all()
            while shared.taken not in shared.ready and not shared.stopped and (
                    shared.end is None or shared.taken < shared.end):
                shared.cond.wait()
            shared.waiting = None
            item = shared.ready.pop(shared.taken, _END)
            if item is not _END:
                shared.took(shared.taken)
        if item is _END or isinstance(item, _Failed):
            self.close()
            if item is _END:
                raise StopIteration
            raise item.error
        return item

    def close(self, timeout: float = 60.0) -> None:
        """Stop the threads and wait for them, ``timeout`` seconds in all (each finishes the batch it is
        on: bounded by the RPC timeouts); the iterator is finished."""
        self._finished = True
        self._shared.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def alive(self) -> int:
        """How many of the threads are still running."""
        return sum(t.is_alive() for t in self._threads)


class Prefetcher(LoaderThreads):
    """Runs an iterator in a background thread, ``depth`` items ahead, so sampling and remote fetches
    overlap training (one thread over any iterator; the loaders drive :class:`LoaderThreads` directly).
    Errors are re-raised in the consumer; ``close`` stops and joins the thread (also on garbage
    collection), and a finished prefetcher keeps raising ``StopIteration``.

    Examples
    --------
    >>> list(Prefetcher(iter(range(3))))
    [0, 1, 2]
    """

    def __init__(self, source: Iterator, depth: int = 2) -> None:
        super().__init__(iter(source).__next__, None, threads=1, depth=max(1, depth), name="graphstore-prefetch")

    @property
    def _thread(self) -> threading.Thread:
        return self._threads[0]
