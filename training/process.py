"""Process-group and RPC set-up and tear-down, and a watchdog that names dead peers within a bound."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from sampling.transport import LoopbackTransport, RpcTransport, Transport
from training.world import World, free_port

logger = logging.getLogger(__name__)
_RPC_KEY = "graphstore/rpc_address"


class PeerFailure(RuntimeError):
    """Another rank died or stopped answering; the message names it."""


def start(world: World, timeout: float, use_rpc: bool) -> Transport:
    """Join the process group (gloo/nccl) and, when partitions must talk, the RPC group.

    Rank 0 picks a free port for RPC and publishes it through the process group's store.
    """
    dist.init_process_group(world.backend, init_method=world.init_method, rank=world.rank,
                            world_size=world.world_size, timeout=timedelta(seconds=timeout))
    if not use_rpc:
        return LoopbackTransport.group(1)[0] if world.world_size == 1 else _NoRemote(world)
    from torch.distributed import rpc

    store = dist.distributed_c10d._get_default_store()
    if world.rank == 0:
        store.set(_RPC_KEY, f"{world.master_addr}:{free_port(world.master_addr)}")
    address = store.get(_RPC_KEY).decode()
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{address}", rpc_timeout=timeout,
                                              num_worker_threads=16)
    # under torchrun, rank 0 must host the RPC rendezvous on the new port itself, not expect the agent to
    agent_store = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        rpc.init_rpc(f"worker{world.rank}", rank=world.rank, world_size=world.world_size, rpc_backend_options=options)
    finally:
        if agent_store is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store
    return RpcTransport(world.rank, world.world_size, timeout)


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
    with an error naming every rank whose heartbeat is older than ``limit`` seconds.

    ``dead_ranks()`` is also used to name the culprit when a collective or RPC fails.
    """

    def __init__(self, world: World, limit: float, interval: float = 2.0) -> None:
        self.world, self.limit, self.interval = world, limit, interval
        self.store = dist.distributed_c10d._get_default_store()
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (last heartbeat value, when it changed)
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, daemon=True, name="graphstore-watchdog")
        self._thread.start()

    def _beat(self) -> None:
        self._count = getattr(self, "_count", 0) + 1
        self.store.set(f"graphstore/heartbeat/{self.world.rank}", str(self._count))

    def dead_ranks(self) -> list[int]:
        """Ranks whose heartbeat has not changed for ``limit`` seconds of this machine's monotonic
        clock (no clock comparison across machines); rank 0 when the store it hosts is gone."""
        beats = self._beats()
        if beats is None:
            return [0] if self.world.rank != 0 else []
        now = time.monotonic()
        for rank, value in beats.items():
            if self._seen.get(rank, (None,))[0] != value:
                self._seen[rank] = (value, now)
        return [r for r, (_, since) in sorted(self._seen.items()) if now - since > self.limit]

    def _beats(self) -> dict[int, str] | None:
        try:
            keys = [f"graphstore/heartbeat/{r}" for r in range(self.world.world_size) if r != self.world.rank]
            return {int(k.rsplit("/", 1)[1]): (self.store.get(k).decode() if self.store.check([k]) else "")
                    for k in keys}
        except Exception:
            return None

    def stalled_ranks(self) -> list[int]:
        """Ranks whose heartbeat does not advance over ~2.5 beats: the peers that died (a failed
        collective does not say which). Rank 0 when the store it hosts is gone."""
        before = self._beats()
        time.sleep(2.5 * self.interval)
        after = self._beats()
        if before is None or after is None:
            return [0] if self.world.rank != 0 else []
        return [r for r in before if before[r] == after.get(r)]

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:
                pass
            dead = self.dead_ranks()  # called every beat: it tracks when each heartbeat last changed
            if time.monotonic() - started < self.limit:
                continue  # give slow starters the full limit
            if dead and not self._stop.is_set():
                logger.error("rank %d: rank(s) %s stopped responding (no heartbeat for %.0f s); exiting",
                             self.world.rank, dead, self.limit)
                _hard_exit(f"graphstore-train rank {self.world.rank}: peer rank(s) {dead} died or hung "
                           f"(no heartbeat for {self.limit:.0f} s); stopping this rank")

    def stop(self) -> None:
        self._stop.set()


def _hard_exit(message: str) -> None:
    """Write ``message`` straight to stderr (no buffers to flush) and end the process at once."""
    os.write(2, (message + "\n").encode())
    os._exit(3)
