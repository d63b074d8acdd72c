"""How samplers and feature fetchers reach other partitions: a small Transport interface.

Callees are named (``"sample"``, ``"gather"``), never numbered by registration order, and every
call has a timeout. ``LoopbackTransport`` connects in-process "ranks" (tests, one machine);
``RpcTransport`` uses ``torch.distributed.rpc`` (TensorPipe).
"""

from __future__ import annotations

import logging
import threading
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from graphstore.errors import GraphstoreError
from sampling.distributed.wire import WireStats, payload_bytes

logger = logging.getLogger(__name__)

Handler = Callable[..., Any]
_HANDLERS: dict[str, Handler] = {}  # this process's named callees (RpcTransport)
_LOCK = threading.Lock()
_CALLS_LOCK = threading.Lock()  # ``calls`` counters: a rank's loader threads call at the same time
# what the RPC agent says when the peer, not its handler, failed; "no such process": tensorpipe's same-machine
# channel reading the memory of a peer that has just died (process_vm_readv)
_LOST_PEER_WORDS = ("timeout", "timed out", "ran for more than", "pipe closed", "eof", "connection",
                    "reset by peer", "shut down", "shutdown", "unreachable", "broken pipe", "no such process")


class PeerError(GraphstoreError, ConnectionError):
    """A remote call failed: the peer is dead, unreachable, too slow, or its handler raised."""


class Transport(ABC):
    """Calls named handlers on other ranks; every call returns a future and has a timeout."""

    rank: int
    world_size: int
    timeout: float

    @abstractmethod
    def register(self, name: str, handler: Handler) -> None:
        """Serve ``handler`` under ``name`` on this rank."""

    @abstractmethod
    def call(self, peer: int, name: str, *args: Any) -> Future:
        """Run ``name(*args)`` on ``peer``; the future raises :class:`PeerError` naming the peer."""

    def shutdown(self) -> None:
        """Stop serving (bounded: never waits for dead peers)."""


class LoopbackTransport(Transport):
    """In-process transport: every rank's handlers live in one shared table; calls run inline.

    Examples
    --------
    >>> a, b = LoopbackTransport.group(2)
    >>> b.register("echo", lambda x: x * 2)
    >>> a.call(1, "echo", 21).result()
    42
    """

    def __init__(self, rank: int, world_size: int, table: dict[tuple[int, str], Handler]) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, 0.0
        self._table = table
        self.calls = 0  # remote calls made by this rank (tests assert on it)
        self.wire = WireStats()  # payload bytes per peer and kind, as RpcTransport would send them

    @classmethod
    def group(cls, world_size: int) -> list[LoopbackTransport]:
        table: dict[tuple[int, str], Handler] = {}
        return [cls(r, world_size, table) for r in range(world_size)]

    def register(self, name: str, handler: Handler) -> None:
        self._table[(self.rank, name)] = handler

    def call(self, peer: int, name: str, *args: Any) -> Future:
        with _CALLS_LOCK:
            self.calls += 1
        future: Future = Future()
        handler = self._table.get((peer, name))
        if handler is None:
            future.set_exception(PeerError(f"rank {peer} serves no handler {name!r}"))
            return future
        try:
            result = handler(*args)
            self.wire.add(peer, name, payload_bytes(args), payload_bytes(result))
            future.set_result(result)
        except Exception as exc:  # the peer's failure, delivered to the caller
            future.set_exception(PeerError(f"rank {peer} failed in {name!r}: {exc}"))
        return future


@dataclass(frozen=True)
class HandlerFailed:
    """What a handler raised, returned as a value: torch's RPC server would print every raised exception
    with its traceback on the callee's stderr, burying the caller's one-line error."""

    kind: str
    message: str
    traceback: str
    named: bool = False  # a graphstore error naming its own cause (bad input, damaged data), not an echo


class RemoteHandlerError(PeerError):
    """A peer's handler raised: ``peer`` and what it raised (``failed``) are kept for the launcher's summary."""

    def __init__(self, text: str, peer: int, failed: HandlerFailed) -> None:
        super().__init__(text)
        self.peer, self.failed = peer, failed


def _dispatch(name: str, args: tuple) -> Any:
    """The one function RPC runs remotely: look the handler up by name in the callee's table."""
    handler = _HANDLERS.get(name)
    try:
        if handler is None:
            raise KeyError(f"this rank serves no handler {name!r} (registered: {sorted(_HANDLERS)})")
        return handler(*args)
    except Exception as exc:
        named = isinstance(exc, GraphstoreError) and not isinstance(exc, PeerError)
        return HandlerFailed(type(exc).__name__, str(exc), traceback.format_exc(), named)


class RpcTransport(Transport):
    """``torch.distributed.rpc`` transport. ``init_rpc`` must have been called (training does it).

    Worker names are ``worker<rank>``; calls go through :func:`_dispatch` with the handler's name.
    """

    def __init__(self, rank: int, world_size: int, timeout: float = 120.0) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.calls = 0
        self.wire = WireStats()  # payload bytes per peer and kind (requests sent, responses received)

    def register(self, name: str, handler: Handler) -> None:
        with _LOCK:
            _HANDLERS[name] = handler

    def call(self, peer: int, name: str, *args: Any) -> Future:
        from torch.distributed import rpc

        with _CALLS_LOCK:
            self.calls += 1
        out: Future = Future()
        sent = payload_bytes(args)
        try:
            fut = rpc.rpc_async(f"worker{peer}", _dispatch, args=(name, args), timeout=self.timeout)
        except Exception as exc:  # the agent is gone or the peer is unknown
            out.set_exception(PeerError(f"cannot reach rank {peer} for {name!r}: {exc}"))
            return out

        def done(f: Any) -> None:
            try:
                result = f.wait()
            except Exception as exc:
                out.set_exception(self._error(peer, name, exc))
                return
            self.wire.add(peer, name, sent, payload_bytes(result))
            if isinstance(result, HandlerFailed):
                logger.debug("rank %d failed in %r:\n%s", peer, name, result.traceback)
                out.set_exception(RemoteHandlerError(f"rank {peer} failed in {name!r}: {result.kind}: {result.message}",
                                                     peer, result))
            else:
                out.set_result(result)

        fut.add_done_callback(done)
        return out

    def _error(self, peer: int, name: str, exc: Exception) -> PeerError:
        """Tell a peer that did not answer from a handler that raised on the peer (``peer`` and
        ``handler`` are kept on the error, so the trainer can name the host and the stage)."""
        error = self._describe(peer, name, exc)
        error.peer, error.handler = peer, name
        return error

    def _describe(self, peer: int, name: str, exc: Exception) -> PeerError:
        text = str(exc)
        lost = isinstance(exc, RuntimeError) and any(
            word in text.lower() for word in _LOST_PEER_WORDS) and not isinstance(exc, GraphstoreError)
        if lost:
            return PeerError(f"rank {peer} did not answer {name!r} (dead, unreachable, or slower than the "
                             f"{self.timeout:.0f} s timeout): {text}")
        return PeerError(f"rank {peer} failed in {name!r}: {type(exc).__name__}: {text}")

    def shutdown(self) -> None:
        with _LOCK:
            _HANDLERS.clear()
