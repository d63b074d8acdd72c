"""How a :class:`~training.loop.session.Session` joins its job and leaves it: the process group, RPC and
partition servers of a rank that holds partitions, or the trainers' group and sampler servers of one that
holds none; the one-line explanation of a failure a lost peer caused. A mixin of the session."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from graphstore.errors import GraphstoreError, InvalidInputError
from sampling.distributed.server import PartitionServer
from training.cluster import process_groups, threads
from training.cluster.world import World
from training.launcher import failures, placement

_HANDLER_STAGES = {"sample": "sampling", "gather": "feature fetch", "edge_attr": "edge-attribute fetch"}


class SessionJoin:
    """The session's start-up and shutdown (see the module docstring); its state is the session's."""

    def _start_served(self) -> Any:
        """Join the trainers' process group (no RPC: they hold no partition) and the sampler servers."""
        from graphstore.dataset.manifest import Manifest
        from sampling.remote.client import SamplerServers, ServedDataset

        self.layout, self.parts = None, ()
        self.threads = threads.choose(self._threads, self.world.local_world_size)
        threads.apply(self.threads)
        self._started = True
        try:
            self.transport = process_groups.start(self.world, self.timeout, use_rpc=False, interface=self.interface)
            self.cpu_group = dist.new_group(backend="gloo") if self.world.use_cuda else None
            self.watchdog = process_groups.Watchdog(self.world, limit=self.timeout)
            process_groups.set_stage("connecting to the sampler servers")
            self.servers = SamplerServers(self.served_by, self.timeout, self._job_name(), self.world.rank,
                                          self.world.world_size).connect()
            self.transport.wire = self.servers.wire  # what the epoch records count: bytes from the servers
            hello = self.servers.hello
            if hello["url"] != self.url:
                raise InvalidInputError(f"the sampler servers at {self.served_by} serve {hello['url']}, not {self.url}: "
                                        "give the URL they were started with")
            self.dataset = ServedDataset(Manifest.from_json(hello["manifest"], hello["url"]), hello["url"])
            process_groups.set_stage("start-up")
            self.barrier()
            process_groups.set_stage("training")
        except BaseException as exc:
            self.close(exc)
            raise
        return self

    def _job_name(self) -> str:
        """A name every rank of this job shares (rank 0's, through the rendezvous store), for the servers."""
        import uuid

        store = dist.distributed_c10d._get_default_store()
        if self.rank == 0:
            store.set("graphstore/session/job", uuid.uuid4().hex[:12])
        return store.get("graphstore/session/job").decode()

    def _serve(self) -> None:
        """Join the process group and RPC, start the watchdog and this rank's partition servers."""
        self.transport = process_groups.start(self.world, self.timeout, use_rpc=self.dataset.num_parts > 1,
                                       interface=self.interface)
        # bookkeeping collectives use CPU tensors: a gloo group for them when the default is nccl
        self.cpu_group = dist.new_group(backend="gloo") if self.world.use_cuda else None
        self.watchdog = process_groups.Watchdog(self.world, limit=self.timeout)
        PartitionServer(self.dataset, self.parts).register(self.transport)
        process_groups.set_stage("start-up")  # no rank asks a peer that has not registered its handlers yet
        self.barrier()
        process_groups.set_stage("training")

    def _join_env(self) -> World:
        cuda = placement.use_cuda(self._device_choice, placement.gpu_count())
        world = World.from_env(use_cuda=cuda)
        if world is None:  # a script run on its own: a job of one rank
            self._scratch = tempfile.mkdtemp(prefix="graphstore-session-")
            world = World(0, 1, 0, f"file://{self._scratch}/rendezvous", use_cuda=cuda)
        placement.check_local_rank(world.local_rank, cuda, placement.gpu_count())
        if world.use_cuda:
            torch.cuda.set_device(world.device)
        return world

    def close(self, exc: BaseException | None = None) -> None:
        """Leave the job: a barrier when all went well (every rank finishes together), then RPC and the
        process group; bounded to 15 s after a failure. With ``exc``, this rank's error is recorded for
        the launcher's one line, explained when it came from a lost peer."""
        if not self._started:
            self._remove_scratch()
            return
        self._started = False
        graceful = exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None))
        try:
            if graceful:
                process_groups.set_stage("shutdown")
                self._say_left()
                try:
                    self.barrier()
                except Exception as late:  # a peer failed at the end: this rank leaves as a failed one
                    graceful, exc = False, late
                    raise
            elif exc is not None and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
                failures.record(self.world.rank, self.explain(exc))
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            if not graceful:  # leaving a failed job must be bounded too, whatever the peers do
                process_groups.exit_after(15.0, f"graphstore rank {self.world.rank}: shutdown after the failure did not "
                                         "finish within 15 s; exiting")
            if self.servers is not None:
                self.servers.close(finished=graceful)
            process_groups.stop(self.transport, graceful=graceful)
            self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def explain(self, exc: BaseException) -> BaseException:
        """``exc`` as this rank saw it, or, when it came from a lost peer or a broken collective, an
        error naming this rank, the lost rank and its host, and the stage."""
        from sampling.distributed.transport import PeerError

        me = f"rank {self.world.rank} at {process_groups.HOSTS.get(self.world.rank, '?')}"
        if isinstance(exc, PeerError) and "did not answer" in str(exc):
            peer = getattr(exc, "peer", None)
            if peer is not None and self.watchdog is not None:
                self.watchdog.let_it_judge(peer)  # a hung peer: the watchdog's verdict names the cause
            where = _HANDLER_STAGES.get(getattr(exc, "handler", ""), process_groups.stage())
            lost = process_groups.describe([peer]) if peer is not None else "a peer"
            return process_groups.PeerFailure(f"{me}: lost {lost} during {where}: {exc}")
        if isinstance(exc, (GraphstoreError, process_groups.PeerFailure)) or not (failures.is_echo(exc) or collective(exc)):
            return exc  # names its problem already, or the script's own error
        dead = self.watchdog.stalled_ranks() if self.watchdog else []
        who = f"lost {process_groups.describe(dead)}" if dead else "a peer or collective failed"
        where = f"the {process_groups.stage()} all-reduce" if collective(exc) else process_groups.stage()
        return process_groups.PeerFailure(f"{me}: {who} during {where}: {type(exc).__name__}: {exc}")


def collective(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a gloo collective (DDP's gradient all-reduce, a metrics all-reduce)."""
    text = str(exc).lower()
    return any(w in text for w in ("gloo", "allreduce", "all_reduce", "collective", "barrier"))
