"""Distributed sampling: own partition locally, the rest from its owners.

Per hop the frontier is split by owner with the range partition book; owned nodes are sampled from
the memory-mapped CSC here, the others in one batched request per remote partition, all issued
before the local work starts. Features: :mod:`sampling.distributed.dist_features`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from graphstore.dataset.opened import Dataset
from graphstore.errors import InvalidInputError
from sampling.drivers.neighbor_sampler import NeighborSampler
from sampling.distributed.server import SAMPLE, PartitionServer  # noqa: F401  (PartitionServer re-exported: training and tools start it from here)
from sampling.graph.topology import EdgeTopology, from_dataset
from sampling.distributed.transport import Transport
from sampling.distributed.wire import EDGE_IDS, POSITIONS, pack


@dataclass(frozen=True)
class RankLayout:
    """Which rank holds which partitions, for any rank count over any partition count.

    A partition is storage (fixed at ingest), a rank is compute (whatever hardware is at hand). With
    fewer ranks than partitions, rank r owns a contiguous block of them (``parts_of``: ``P // W`` or one
    more each), which is one contiguous range of global IDs per node type. With at least as many ranks
    as partitions, each partition is held by a group of consecutive ranks (``W // P`` or one more each;
    one machine's, under torchrun/SLURM), which split its seeds, and any of them answers for it.

    Examples
    --------
    >>> RankLayout(4, 3).parts_of(1), RankLayout(2, 3).ranks_of(0)
    ((1,), range(0, 2))
    """

    num_parts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.num_parts < 1:
            raise InvalidInputError(f"{self.world_size} rank(s) over {self.num_parts} partition(s): both must be "
                                    ">= 1; change --nproc / --nnodes x --nproc-per-node")

    def parts_of(self, rank: int) -> tuple[int, ...]:
        """The partitions ``rank`` serves (and takes its seeds from), in order."""
        p, w = self.num_parts, self.world_size
        if w <= p:
            return tuple(range(rank * p // w, (rank + 1) * p // w))
        return (next(q for q in range(p) if rank in self.ranks_of(q)),)

    def part_of(self, rank: int) -> int:
        """The first partition ``rank`` serves."""
        return self.parts_of(rank)[0]

    def ranks_of(self, part: int) -> range:
        """The ranks that serve ``part`` (one when ranks are fewer than partitions)."""
        p, w = self.num_parts, self.world_size
        if w <= p:
            return range(self.owner_of(part), self.owner_of(part) + 1)
        return range(part * w // p, (part + 1) * w // p)

    def owner_of(self, part: int) -> int:
        """The first rank serving ``part``."""
        p, w = self.num_parts, self.world_size
        if w > p:
            return part * w // p
        return next(r for r in range(w) if r * p // w <= part < (r + 1) * p // w)

    def share(self, rank: int, part: int) -> tuple[int, int]:
        """``(i, n)``: ``rank`` is the i-th of the n ranks that split ``part``'s seeds."""
        ranks = self.ranks_of(part)
        return ranks.index(rank), len(ranks)

    @property
    def ranks_per_part(self) -> int:
        """Ranks per partition when every partition has the same number (else the smallest)."""
        return max(1, self.world_size // self.num_parts)

    def server(self, part: int, caller: int) -> int:
        """The rank of ``part`` that answers ``caller`` (callers spread over the partition's ranks)."""
        ranks = self.ranks_of(part)
        return ranks[caller % len(ranks)]


@dataclass
class RemoteStats:
    """This process's remote traffic: requests, seconds spent waiting on them, rows fetched."""

    requests: int = 0
    wait_seconds: float = 0.0
    rows: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def add(self, requests: int = 0, wait: float = 0.0, rows: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.wait_seconds += wait
            self.rows += rows

    def snapshot(self, reset: bool = False) -> dict[str, float]:
        with self._lock:
            out = {"requests": self.requests, "wait_seconds": self.wait_seconds, "rows": self.rows,
                   "cache_hits": self.cache_hits, "cache_misses": self.cache_misses}
            if reset:
                self.requests = self.rows = self.cache_hits = self.cache_misses = 0
                self.wait_seconds = 0.0
        return out


def waited(stats: RemoteStats, future: Any) -> Any:
    start = time.perf_counter()
    try:
        return future.result()
    finally:
        stats.add(wait=time.perf_counter() - start)


@dataclass(frozen=True)
class RemoteBlock:
    """A partition this rank does not hold: sampling requests go to one of its ranks."""

    lo: int
    hi: int
    part: int
    edge_type: Any
    transport: Transport
    layout: RankLayout
    stats: RemoteStats
    options: tuple  # (weight_attr, time_attr, message_edges) the server samples with
    returns: int = EDGE_IDS | POSITIONS  # edge IDs / CSC positions the batch needs (else -1 here, unsent)
    is_remote = True

    def start(self, nodes: np.ndarray, fanout: int, replace: bool, limits: np.ndarray, strategy: int,
              exclusion: tuple | None, seed: int) -> Callable[[], tuple[Any, ...]]:
        """Send one hop's request for ``nodes`` (their time ``limits``, empty if none; ``seed`` seeds the
        server's draws, so a seeded sampler samples the same wherever it runs); returns a getter of the
        answer as it came over the wire (:func:`sampling.distributed.wire.pack_sample`: counts, neighbours, edge IDs, positions),
        which the driver reads straight into its arrays."""
        peer = self.layout.server(self.part, self.transport.rank)
        future = self.transport.call(peer, SAMPLE, self.edge_type, self.part, pack(nodes), fanout, replace,
                                     pack(limits), strategy, self.options, exclusion, self.returns, seed)
        self.stats.add(requests=1)
        return lambda: waited(self.stats, future)


class DistributedSampler(NeighborSampler):
    """``NeighborSampler`` over a partitioned dataset: own partition local, the others over ``transport``.

    ``edge_ids=False`` leaves edge IDs out of the outputs (no ``e_id`` in batches), and so out of the
    sampling answers of remote partitions, unless an edge type's attributes need them.

    Examples
    --------
    >>> sampler = DistributedSampler(ds, [15, 10], transport, RankLayout(2, 2))  # doctest: +SKIP
    """

    def __init__(self, dataset: Dataset, num_neighbors: Any, transport: Transport, layout: RankLayout,
                 stats: RemoteStats | None = None, edge_ids: bool = True, **options: Any) -> None:
        if not isinstance(edge_ids, bool):
            raise InvalidInputError(f"edge_ids={edge_ids!r} given to the distributed sampler/loader: pass True "
                                    "(batches carry e_id) or False (no e_id, fewer bytes on the wire)")
        self.transport, self.layout, self.edge_ids = transport, layout, edge_ids
        self.parts = layout.parts_of(transport.rank)  # sampled here from storage; the others over transport
        self.stats = stats or RemoteStats()
        super().__init__(dataset, num_neighbors, **options)

    def _subgraph(self, out: Any) -> Any:
        out = super()._subgraph(out)
        if not self.edge_ids:
            out.edge = None if isinstance(out.row, torch.Tensor) else {}
        return out

    def _returns(self, edge_type: Any) -> int:
        """What remote answers for ``edge_type`` must carry: positions for its attributes (edge IDs
        too: a bidirectional batch locates them by ID), edge IDs for the outputs."""
        has_attrs = bool(self._data.manifest.edge_type(edge_type).attrs)
        return (EDGE_IDS if self.edge_ids or has_attrs else 0) | (POSITIONS if has_attrs else 0)

    @property
    def topology(self) -> dict[Any, EdgeTopology]:
        if self._topology is None:
            c = self.config
            local = from_dataset(self._data, list(self.parts), c.weight_attr, c.time_attr, mask=c.message_edges)
            out = {}
            for etype, topo in local.items():
                dst = self._data.node_offsets(topo.dst_type)
                blocks: list[Any] = []
                for p in range(self._data.num_parts):
                    blocks.append(topo.blocks[self.parts.index(p)] if p in self.parts else RemoteBlock(
                        int(dst[p]), int(dst[p + 1]), p, etype, self.transport, self.layout, self.stats,
                        (c.weight_attr, c.time_attr, c.message_edges), self._returns(etype)))
                out[etype] = EdgeTopology(etype, topo.src_type, topo.dst_type, blocks, topo.num_src, topo.num_dst)
            self._topology = out
        return self._topology
