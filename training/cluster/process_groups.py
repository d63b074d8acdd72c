"""Process-group and RPC set-up and tear-down, and a watchdog that names dead peers within a bound."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from sampling.distributed.transport import LoopbackTransport, RpcTransport, Transport
from training.launcher import netif
from training.launcher.lifetime import record_message, say
from training.cluster.world import World, free_port

logger = logging.getLogger(__name__)
_RPC_KEY = "graphstore/rpc_address"


class PeerFailure(RuntimeError):
    """Another rank died or stopped answering; the message names it."""


def start(world: World, timeout: float, use_rpc: bool, interface: str | None = None) -> Transport:
    """Join the process group (gloo/nccl) and, when partitions must talk, the RPC group.

    Across hosts, gloo and TensorPipe get the interface on the route to MASTER_ADDR (or ``interface``);
    every rank's address is then known to all (``HOSTS``) so failures can name the host that was lost.
    Rank 0 picks a free port for RPC and publishes it through the process group's store.
    """
    choice = netif.configure(world.master_addr, interface, log=world.local_rank == 0)
    HOSTS[-1] = f"{choice.address if choice else '127.0.0.1'} ({socket.gethostname()})"
    set_stage("rendezvous")
    _join(world, timeout)
    _gather_hosts(world)
    if not use_rpc:
        set_stage("training")
        return LoopbackTransport.group(1)[0] if world.world_size == 1 else _NoRemote(world)
    set_stage("RPC init")
    _init_rpc(world, timeout)
    set_stage("training")
    return RpcTransport(world.rank, world.world_size, timeout)


def _join(world: World, timeout: float) -> None:
    """``init_process_group``, with a bounded rendezvous that names the ranks that never joined."""
    store = _store(world, timeout)
    kwargs = {"init_method": world.init_method} if store is None else {"store": store}
    if store is not None:
        prefix = f"graphstore/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/joined/"
        store.set(f"{prefix}{world.rank}", "1")
        try:
            store.wait([f"{prefix}{r}" for r in range(world.world_size)], timedelta(seconds=timeout))
        except Exception as exc:
            missing = [r for r in range(world.world_size) if not _has(store, f"{prefix}{r}")]
            raise PeerFailure(f"rank {world.rank} at {_me()}: rendezvous: rank(s) {missing or '?'} never joined "
                              f"within {timeout:.0f} s (--timeout); start every host's ranks, and check that "
                              f"their MASTER_ADDR/MASTER_PORT point at {world.master_addr}") from exc
    dist.init_process_group(world.backend, rank=world.rank, world_size=world.world_size,
                            timeout=timedelta(seconds=timeout), **kwargs)


def _store(world: World, timeout: float) -> dist.Store | None:
    """The rendezvous store of a ``tcp://``/``env://`` job (torchrun's agent store when it hosts one),
    created with a bounded, named connect failure; ``None`` for ``file://`` (one machine)."""
    if world.init_method.startswith("file://"):
        return None
    if world.init_method.startswith("tcp://"):
        host, _, port = world.init_method[len("tcp://"):].rpartition(":")
    else:
        host, port = os.environ.get("MASTER_ADDR", world.master_addr), os.environ.get("MASTER_PORT", "")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    master = world.rank == 0 and not agent
    try:
        store = dist.TCPStore(host, int(port), world.world_size, is_master=master,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False)
        _RDZV[:] = [(host, int(port))]
        return store
    except Exception as exc:
        role = "listen on" if master else "reach rank 0's rendezvous at"
        raise PeerFailure(f"rank {world.rank} at {_me()}: rendezvous: cannot {role} {host}:{port} within "
                          f"{timeout:.0f} s ({_first_line(exc)}); check MASTER_ADDR and MASTER_PORT (wrong "
                          f"address, closed or blocked port, or host of rank 0 not started)") from exc


def _has(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


RPC_TRANSPORTS = ("uv", "ibv")  # TensorPipe's, those it has built in; "shm" left out on purpose (see _init_rpc)


def _init_rpc(world: World, timeout: float) -> None:
    from torch.distributed import rpc

    store = dist.distributed_c10d._get_default_store()
    if world.rank == 0:
        store.set(_RPC_KEY, f"{world.master_addr}:{free_port(_bind_address(world.master_addr))}")
    address = store.get(_RPC_KEY).decode()
    # TCP (libuv) or InfiniBand between ranks, never TensorPipe's shared-memory transport: its reactor thread
    # busy-polls (sched_yield), a third of a core per rank taken from the ranks' own work; tensors between ranks
    # of one host still go by the cross-memory-attach channel (measured: benchmarks/bench_train, RPC transports)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{address}", rpc_timeout=timeout,
                                              num_worker_threads=16, _transports=list(RPC_TRANSPORTS))
    # under torchrun, rank 0 must host the RPC rendezvous on the new port itself, not expect the agent to
    agent_store = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        rpc.init_rpc(f"worker{world.rank}", rank=world.rank, world_size=world.world_size, rpc_backend_options=options)
    except Exception as exc:
        dead = [r for r in range(world.world_size) if r != world.rank]
        raise PeerFailure(f"rank {world.rank} at {_me()}: RPC init: could not connect to {describe(dead)} "
                          f"within {timeout:.0f} s ({_first_line(exc)})") from exc
    finally:
        if agent_store is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store


_RDZV: list[tuple[str, int]] = []  # the TCP rendezvous store's host and port, once joined


def _watch_store(interval: float) -> dist.Store | None:
    """A client of the rendezvous store of its own with a short timeout, so heartbeats never wait behind
    (or as long as) the training thread's store calls; ``None`` for a ``file://`` rendezvous."""
    if not _RDZV:
        return None
    host, port = _RDZV[0]
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(2.0, 2 * interval)))
    except Exception as exc:
        logger.debug("heartbeat store client: %s", exc)
        return None


def _bind_address(master_addr: str) -> str:
    """Where rank 0 can bind a port that other hosts reach: MASTER_ADDR when it is one of this host's
    addresses, else every interface (rank 0's hostname may resolve to loopback)."""
    try:
        with socket.socket() as sock:
            sock.bind((master_addr, 0))
        return master_addr
    except OSError:
        return "0.0.0.0"


# -- who is where, and what the job was doing: for error messages --

HOSTS: dict[int, str] = {}  # rank -> "address (hostname)", known after the rendezvous
_STAGE = ["starting"]


def set_stage(stage: str) -> None:
    """Record what this rank is doing (rendezvous, RPC init, training, evaluation, shutdown)."""
    _STAGE[0] = stage


def stage() -> str:
    return _STAGE[0]


def _me() -> str:
    return HOSTS.get(-1) or socket.gethostname()


def _gather_hosts(world: World) -> None:
    me = _me()
    gathered: list[str | None] = [None] * world.world_size
    dist.all_gather_object(gathered, me)
    HOSTS.update({r: str(h) for r, h in enumerate(gathered)})


def describe(ranks: list[int]) -> str:
    """``rank 1 at 10.0.0.2 (node7)``, for every rank in ``ranks``."""
    return ", ".join(f"rank {r} at {HOSTS[r]}" if r in HOSTS else f"rank {r}" for r in ranks) or "no rank"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


class _NoRemote(LoopbackTransport):
    """Transport of a job whose ranks never call each other (one partition: plain data parallelism)."""

    def __init__(self, world: World) -> None:
        super().__init__(world.rank, world.world_size, {})


def stop(transport: Transport, graceful: bool, timeout: float = 30.0) -> None:
    """Leave RPC and the process group; a failed job never waits for dead peers."""
    if isinstance(transport, RpcTransport):
        from torch.distributed import rpc

        try:
            rpc.shutdown(graceful=graceful, timeout=timeout)
        except Exception as exc:  # peers already gone: nothing left to wait for
            logger.debug("rpc shutdown: %s", exc)
        transport.shutdown()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:
            logger.debug("destroy_process_group: %s", exc)


class Watchdog:
    """Each rank bumps a heartbeat key in the rendezvous store; a thread ends this process (exit 3)
    with an error naming every rank whose heartbeat is older than ``limit`` seconds, or rank 0 (whose
    host keeps the store) when the store has not answered for ``limit`` seconds.

    Store I/O runs in a poller thread of its own: a call into a silently cut link may block for
    minutes, so the judging thread and ``dead_ranks``/``stalled_ranks`` only read what the poller saw.
    """

    def __init__(self, world: World, limit: float, interval: float = 2.0) -> None:
        self.world, self.limit, self.interval = world, limit, interval
        self.store = _watch_store(interval) or dist.distributed_c10d._get_default_store()
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (last heartbeat value, when it changed)
        self._last_ok = time.monotonic()  # when the store last answered
        self._polls = 0  # successful polls so far
        self._stop = threading.Event()
        self._count = 0
        self._poll_once()
        self._threads = [threading.Thread(target=self._poll, daemon=True, name="graphstore-heartbeat"),
                         threading.Thread(target=self._run, daemon=True, name="graphstore-watchdog")]
        for thread in self._threads:
            thread.start()

    def _poll_once(self) -> None:
        self._count += 1
        try:
            self.store.set(f"graphstore/heartbeat/{self.world.rank}", str(self._count))
            keys = [f"graphstore/heartbeat/{r}" for r in range(self.world.world_size) if r != self.world.rank]
            beats = {int(k.rsplit("/", 1)[1]): (self.store.get(k).decode() if self.store.check([k]) else "")
                     for k in keys}
        except Exception as exc:
            logger.debug("heartbeat: %s", exc)
            return
        now = time.monotonic()
        with self._lock:
            self._last_ok, self._polls = now, self._polls + 1
            for rank, value in beats.items():
                if self._seen.get(rank, (None,))[0] != value:
                    self._seen[rank] = (value, now)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll_once()

    def _silent(self, seconds: float) -> tuple[list[int], bool]:
        """Ranks silent for more than ``seconds``, and whether that is because the store is gone."""
        now = time.monotonic()
        with self._lock:
            if self.world.rank != 0 and now - self._last_ok > seconds:
                return [0], True
            return [r for r, (_, since) in sorted(self._seen.items()) if now - since > seconds], False

    def dead_ranks(self) -> list[int]:
        """Ranks whose heartbeat has not changed for ``limit`` seconds of this machine's monotonic
        clock (no clock comparison across machines); rank 0 when the store its host keeps is gone."""
        return self._silent(self.limit)[0]

    def stalled_ranks(self) -> list[int]:
        """Ranks whose heartbeat has not advanced for 3 beats once this one has polled the store at
        least 3 times over 4 beats: the peers that died (a failed collective does not say which). A
        live rank's change is seen within about 2 beats. Rank 0 when the store its host keeps does not
        answer meanwhile."""
        with self._lock:
            polls = self._polls
        started = time.monotonic()
        while time.monotonic() - started < 8 * self.interval:
            time.sleep(0.2)
            now = time.monotonic()
            with self._lock:
                if self._polls >= polls + 3 and now - started >= 4 * self.interval:
                    return [r for r, (_, since) in sorted(self._seen.items()) if now - since >= 3 * self.interval]
        return [0] if self.world.rank != 0 else []

    def let_it_judge(self, rank: int) -> None:
        """When ``rank`` did not answer and its heartbeat is stale too (3 beats), wait (bounded by the
        limit) for this watchdog to name it, which ends the process with the cause; return at once while
        its heartbeat is live (only the call was lost, an echo) or when the watchdog has stopped."""
        deadline = time.monotonic() + self.limit + 2 * self.interval
        while time.monotonic() < deadline and not self._stop.is_set():
            with self._lock:
                seen = self._seen.get(rank)
            if seen is None or time.monotonic() - seen[1] < 3 * self.interval:
                return
            time.sleep(0.2)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.interval / 2):
            if time.monotonic() - started < self.limit:
                continue  # give slow starters the full limit
            dead, store_lost = self._silent(self.limit)
            if dead and not self._stop.is_set():
                how = "rendezvous store unreachable" if store_lost else "no heartbeat"
                _hard_exit(f"graphstore-train rank {self.world.rank} at {_me()}: lost {describe(dead)} during "
                           f"{stage()}: died, hung or unreachable ({how} for {self.limit:.0f} s, --timeout); "
                           f"stopping this rank", record=self.world.rank)

    def stop(self) -> None:
        self._stop.set()


def exit_after(seconds: float, message: str) -> None:
    """End this process with ``message`` (exit 3) unless it has exited by itself within ``seconds``."""
    timer = threading.Timer(seconds, _hard_exit, args=(message,))
    timer.daemon = True
    timer.start()


def _hard_exit(message: str, record: int | None = None) -> None:
    """Write ``message`` straight to stderr (no buffers to flush) and end the process at once; with
    ``record`` (this rank), also as the rank's error for the launcher's one line, unless it has one."""
    say(message)
    if record is not None:
        record_message(record, message)
    os._exit(3)
