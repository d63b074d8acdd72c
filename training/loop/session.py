"""A rank's handle on a training job (``Session``): joins the job, opens the dataset, serves this rank's
partitions, hands out loaders that agree on their length, checkpoints with loader positions, and shuts
everything down, bounded."""

from __future__ import annotations

import logging
import os
import random
import threading
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import graphstore
from graphstore.errors import InvalidInputError
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import RemoteStats
from training.launcher import allocator, forkserver, lifetime
from training.cluster import preempt, process_groups, threads
from training.loop import featurecache, session_features
from training.loop.session_loaders import Loader
from training.loop.session_join import SessionJoin
from training.loop.session_methods import SessionLoaders
from training.loop.session_state import load_checkpoint, save_checkpoint
from training.cluster.world import DEVICE_ENV, FEATURE_CACHE_ENV, LOADER_WORKERS_ENV, SERVERS_ENV, TIMEOUT_ENV, World

logger = logging.getLogger(__name__)

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT}


class Session(SessionJoin, SessionLoaders):
    """One rank of a training job, as a context manager: what a training script holds.

    ``Session(url, **options)`` joins the job that ``graphstore-run``, ``torchrun`` or ``srun`` described
    in the environment (one process on its own when none did), opens the dataset, starts the process
    group (gloo on CPU; nccl for GPU tensors), RPC and this rank's partition servers, a watchdog that
    names a dead peer within ``timeout`` seconds, and turns SIGTERM into :attr:`should_stop`. Leaving the
    ``with`` block shuts all of it down, bounded, also when the block raised.

    Parameters
    ----------
    url : str
        The dataset (a path or any URL ``graphstore.open_dataset`` takes), the same on every rank.
    device : {"auto", "cpu", "cuda"}, optional
        Where :attr:`device` points: ``cuda:<local rank>`` under ``cuda`` or ``auto`` on a GPU host.
        Default: ``$GRAPHSTORE_DEVICE`` (``graphstore-run --device``), else ``auto``.
    timeout : float, optional
        Seconds before a silent peer, a stuck collective or a missing loader ends the job, naming the
        rank. Default: ``$GRAPHSTORE_TIMEOUT`` (``graphstore-run --timeout``), else 120.
    seed : int
        Seeds torch, numpy and ``random`` (the same initial weights on every rank) and every loader's
        order and sampling streams: the same seed gives the same batches.
    storage_options, cache_dir, cache_max_bytes, verify_reads
        As for ``graphstore.open_dataset``.
    threads, loader_threads : int, optional
        Torch threads and loader threads per rank (default: this host's cores shared by its ranks).
    loader_workers : int, optional
        Sampler processes beside this rank for each loader (``num_workers`` of a loader overrides it):
        sampling and feature gathering out of the rank's process, the same batches as its threads.
        Default: ``$GRAPHSTORE_LOADER_WORKERS`` (``graphstore-run --loader-workers``), else 0.
    unmapped : bool
        Read this rank's partitions with ``pread`` instead of mapping them (uniform node sampling only).
    feature_cache : str or int, optional
        Features larger than memory, as ``graphstore-train --feature-cache``: this rank's own rows of ``x``
        read from disk with direct I/O (no page cache), the hottest up to this size kept in RAM (``"512MB"``,
        bytes; 0: no RAM cache), and :meth:`feature_stats` counting them. Default: ``$GRAPHSTORE_FEATURE_CACHE``
        (``graphstore-run --feature-cache``), else by itself when the rank's own ``x`` exceeds half of its
        memory (its cgroup limit, else the host's, shared by its local ranks); ``"off"``: never. Such a rank's loaders
        default to one thread and one batch ahead, whose rows wait for the memory the limit leaves
        (``prefetch_rows``), and a batch that cannot fit in the limit is refused when the loader is made, in one
        line naming the memory it needs. Left to itself, the rank sizes its RAM cache when its first such loader
        is made: what the memory leaves beside that loader's batch in training, the batches ahead and a tenth of
        the limit (none under 16 MB, at most half of the rank's memory). Sampler processes (``loader_workers``,
        ``num_workers``) read ``x`` as the rank does, their hot rows from its cache in shared memory; a loader
        with them counts their batches in flight in that check (and the memory of those not forked when the
        session started: give ``loader_workers`` here to fork them then).
    interface : str, optional
        Network interface for gloo and RPC across hosts (default: the route to ``MASTER_ADDR``).
    servers : str, optional
        ``HOST:PORT`` of sampler servers (``graphstore serve URL --address HOST:PORT``): this rank opens no
        partition and no file of the dataset; its loaders' batches, features included, are sampled on the
        servers (:mod:`sampling.remote`). Its seeds are its share of the whole dataset's (a mask over every
        partition), split over the ranks of this job. Default: ``$GRAPHSTORE_SERVERS`` (``graphstore-run
        --servers``), else none.

    Examples
    --------
    >>> with Session("graphs/tiny") as s:  # doctest: +SKIP
    ...     loader = s.loader([10, 5], input_nodes="train_mask", batch_size=256, shuffle=True)
    ...     for batch in loader:
    ...         batch = batch.to(s.device)
    """

    def __init__(self, url: str, *, device: str | None = None, timeout: float | None = None, seed: int = 0,
                 storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                 cache_max_bytes: str | None = None, verify_reads: bool = False, threads: int | None = None,
                 loader_threads: int | None = None, loader_workers: int | None = None, unmapped: bool = False,
                 interface: str | None = None, servers: str | None = None, feature_cache: str | int | None = None,
                 world: World | None = None) -> None:
        self.url = str(url)
        if feature_cache is None:
            feature_cache = os.environ.get(FEATURE_CACHE_ENV) or None
        self.feature_cache = session_features.feature_cache_option(feature_cache, "Session(feature_cache=...)")
        if servers is None:
            servers = os.environ.get(SERVERS_ENV) or None
        if loader_workers is None:
            loader_workers = _env_count(LOADER_WORKERS_ENV)
        self.served_by = servers  # HOST:PORT of sampler servers: this rank holds no partition
        if servers is not None:
            from sampling.remote.client import parse_address

            parse_address(servers, "Session(servers=...)")
            if unmapped:
                raise InvalidInputError("Session(unmapped=True) with servers: the servers read the partitions; give "
                                        "graphstore serve the option instead")
            if self.feature_cache not in (None, "off"):
                raise InvalidInputError(f"Session(feature_cache={feature_cache!r}) with servers: the sampler servers read "
                                        "the features; leave it out")
        self.seed = _seed(seed)
        self.timeout = _timeout(timeout if timeout is not None else os.environ.get(TIMEOUT_ENV, 120.0))
        self._device_choice = device or os.environ.get(DEVICE_ENV) or "auto"
        self._open = dict(storage_options=storage_options, cache_dir=cache_dir, cache_max_bytes=cache_max_bytes,
                          verify_reads=verify_reads)
        self._threads, self.loader_threads, self.unmapped, self.interface = threads, loader_threads, unmapped, interface
        for name, value, low in (("threads", threads, 1), ("loader_threads", loader_threads, 1),
                                 ("loader_workers", loader_workers, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise InvalidInputError(f"Session({name}={value!r}): give an integer >= {low}, or leave it out")
        self.loader_workers = loader_workers or 0
        if servers is not None and self.loader_workers:
            raise InvalidInputError(f"Session(loader_workers={loader_workers}) with servers: the sampler servers build "
                                    "the batches; give them processes with graphstore serve --loader-workers")
        forkserver.prefork_samplers(self.loader_workers)  # forked now where no thread runs yet, else spawned later
        self._world = world
        self._scratch: str | None = None  # the rendezvous directory of a session on its own
        self._started = False
        self._stopped = False  # the ranks agreed to stop (SIGTERM)
        self.loaders: list[Loader] = []
        self._positions: list[tuple[int, int, int]] | None = None  # from load(), for loaders made after it
        self.transport: Any = None
        self.watchdog: process_groups.Watchdog | None = None
        self.cpu_group: Any = None
        self.stats = RemoteStats()
        self.servers: Any = None  # the connections to the sampler servers (sampling.remote.client.SamplerServers)
        self.features: featurecache.FeatureReader | None = None  # x read from disk (feature_cache, or beyond memory)

    # -- joining and leaving --

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        self.close(exc)
        if exc is None and self._stopped:  # the script saved and left the loop: the job ends as preempted
            raise SystemExit(preempt.EXIT_PREEMPTED)
        return False

    def start(self) -> Session:
        """Join the job and start serving (``with`` calls it); idempotent."""
        if self._started:
            return self
        self.world = self._world or self._join_env()
        warnings.filterwarnings("ignore", message="You are using a Backend")  # torch's own object collectives
        if threading.current_thread() is threading.main_thread():
            preempt.install()  # SIGTERM: stop at the next step every rank agrees on (should_stop)
        launched = lifetime.watch_launcher(self.world.rank)  # graphstore-run's ranks die with it
        hint = allocator.check_rank()
        if hint and launched is False and self.world.world_size > 1 and self.world.rank == 0:
            logger.warning(hint)
        allocator.keep_freed_memory()  # before any thread starts (see training.launcher.allocator)
        _seed_everything(self.seed)
        if self.served_by is not None:
            return self._start_served()
        self.dataset = graphstore.open_dataset(self.url, self._open["storage_options"] or None,
                                               cache_dir=self._open["cache_dir"],
                                               cache_max_bytes=self._open["cache_max_bytes"],
                                               verify_reads=self._open["verify_reads"])
        self.layout = RankLayout(self.dataset.num_parts, self.world.world_size)
        self.parts = self.layout.parts_of(self.world.rank)
        if self.unmapped:
            self.dataset.read_unmapped(self.parts)
        for part in self.parts:
            for etype in self.dataset.edge_types:  # damaged topology ends this rank before it talks to peers
                self.dataset.check_topology(part, etype)
        self.threads = threads.choose(self._threads, self.world.local_world_size)
        threads.apply(self.threads)
        if self.feature_cache != "off":
            self.features = featurecache.FeatureReader.install(self.dataset, list(self.parts), self.feature_cache,
                                                               self.world.local_world_size,
                                                               shared=bool(self.loader_workers))
        self._started = True
        try:
            self._serve()
        except BaseException as exc:
            self.close(exc)
            raise
        return self

    # -- who and where --

    @property
    def rank(self) -> int:
        return self._joined().world.rank

    @property
    def world_size(self) -> int:
        return self._joined().world.world_size

    @property
    def device(self) -> torch.device:
        """``cuda:<local rank>`` on a GPU rank, else the CPU: move batches and the model here."""
        return self._joined().world.device

    @property
    def num_features(self) -> int | dict[str, int]:
        """Width of ``x``: an int, or per node type (types with ``x``) in a heterogeneous dataset."""
        widths = {n.name: int(np.prod(n.attrs["x"].shape)) for n in self._joined().dataset.manifest.node_types
                  if "x" in n.attrs}
        if not self.dataset.is_hetero:
            if None not in widths:
                raise InvalidInputError(f"{self.dataset.url} has no node features x")
            return widths[None]
        return widths

    @property
    def num_classes(self) -> int | dict[str, int]:
        """Classes of ``y`` (largest label over every partition + 1): an int, or per labelled node type.
        Agreed over the ranks the first time it is read: every rank reads it, at the same point."""
        if not hasattr(self, "_classes"):
            types = [n.name for n in self._joined().dataset.manifest.node_types if "y" in n.attrs]
            if not types:
                raise InvalidInputError(f"{self.dataset.url} has no labels y")
            mine = torch.tensor([self.largest_label(t) for t in types], dtype=torch.int64)
            self.all_reduce(mine, "max")
            self._classes = {t: int(m) + 1 for t, m in zip(types, mine)}
        return self._classes if self.dataset.is_hetero else self._classes[None]

    def largest_label(self, node_type: Any) -> int:
        """The largest label of ``node_type`` on this rank's partitions, or, with sampler servers, on all."""
        if self.servers is None:
            return max_label(self.dataset, self.parts, node_type)
        answers = self.servers.ask_all("labels")
        return max((int(m) for fields, _ in answers for t, m in fields["largest"] if t == node_type), default=-1)

    def _joined(self) -> Session:
        if not self._started:
            raise InvalidInputError("this Session has not started: use it as `with Session(url) as s:` (or call "
                                    "s.start())")
        return self

    # -- together --

    def all_reduce(self, tensor: torch.Tensor, op: str | Any = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over every rank in place (``op``: sum, max, min, product, or a
        ``torch.distributed.ReduceOp``) and return it; bounded by ``timeout``, a lost peer named."""
        reduce_op = _OPS.get(op, op) if isinstance(op, str) else op
        if isinstance(op, str) and op not in _OPS:
            raise InvalidInputError(f"all_reduce op {op!r} is not one of {sorted(_OPS)}")
        group = self.cpu_group if tensor.device.type == "cpu" else None
        try:
            dist.all_reduce(tensor, op=reduce_op, group=group)
        except Exception as exc:
            raise self.explain(exc) from exc
        return tensor

    def barrier(self) -> None:
        """Wait for every rank, at most ``timeout`` seconds; the ranks that did not come are named."""
        try:
            dist.monitored_barrier(group=self.cpu_group, timeout=timedelta(seconds=self.timeout),
                                   wait_all_ranks=True)
        except Exception as exc:
            raise self.explain(exc) from exc

    @property
    def should_stop(self) -> bool:
        """Whether the job was asked to stop (SIGTERM to any rank: preemption, ``scancel``, the launcher).

        Every rank must read it at the same step (it is agreed over the ranks); when it is ``True``, save
        (:meth:`save`) and leave the loop: the session then ends the job with exit code 75, and the same
        command with :meth:`load` goes on at the exact batch.
        """
        if not self._stopped:
            self._stopped = preempt.agreed(self.cpu_group)
        return self._stopped

    def ddp(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.parallel.DistributedDataParallel:
        """``model`` on :attr:`device`, wrapped in ``DistributedDataParallel`` (materialise lazy ``-1``
        input sizes with one forward pass first); unused parameters allowed on heterogeneous datasets."""
        model = model.to(self.device)
        kwargs.setdefault("find_unused_parameters", self.dataset.is_hetero)
        ids = [self.world.local_rank] if self.world.use_cuda else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, **kwargs)

    # -- checkpoints --

    def save(self, state: dict[str, Any], path: str) -> str:
        """Write ``state`` (your model's and optimizer's ``state_dict()``, epoch, ...) to ``path`` with
        every loader's position and every rank's random state; rank 0 writes it atomically, every rank
        returns once it is there. Call it on every rank, at a step boundary (after the step).

        ``state`` is rank 0's: keep in it what the ranks share (DDP's weights, the optimizer, the epoch),
        and reduce numbers each rank counts itself (:meth:`all_reduce`) before you save them."""
        return save_checkpoint(self, state, path)

    def load(self, path: str) -> dict[str, Any]:
        """The ``state`` :meth:`save` wrote to ``path``; every loader (made before or after this call)
        goes on at the batch after the one it had handed out, and each rank's random state is restored."""
        return load_checkpoint(self, path)


def max_label(dataset: Any, parts: tuple[int, ...], node_type: Any) -> int:
    """The largest label in this rank's partitions (-1 when they hold none); the ranks agree on the largest."""
    largest = -1
    for part in parts:
        y = dataset.partition(part)[0][node_type, "y", None]
        if y.numel():
            largest = max(largest, int(y.max()))
    return largest


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**63:
        raise InvalidInputError(f"Session(seed={value!r}): give an integer in [0, 2**63)")
    return int(value)


def _env_count(name: str) -> int:
    """A count from the environment (set by graphstore-run), 0 when unset; one line naming it when not a count."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise InvalidInputError(f"${name}={raw!r}: give a count (0, 1, 2, ...), or unset it")
    return int(raw)


def _timeout(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidInputError(f"timeout {value!r} (Session(timeout=...) or ${TIMEOUT_ENV}): give a finite number "
                                "of seconds > 0")
    return seconds
