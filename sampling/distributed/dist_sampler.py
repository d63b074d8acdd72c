"""Distributed sampling: own partition locally, the rest from its owners.

Per hop the frontier is split by owner with the range partition book; owned nodes are sampled from
the memory-mapped CSC here, the others in one batched request per remote partition, all issued
before the local work starts. Features: :mod:`sampling.distributed.dist_features`.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from graphstore.dataset.opened import Dataset
from graphstore.dataset.rank_layout import RankLayout
from graphstore.errors import InvalidInputError
from sampling.drivers.neighbor_sampler import NeighborSampler
from sampling.distributed.server import SAMPLE, SampleOptions
from sampling.graph.topology import EdgeTopology, from_dataset
from sampling.distributed.transport import Transport
from sampling.distributed.wire import EDGE_IDS, POSITIONS, pack


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
    options: SampleOptions  # what the server samples with
    returns: int = EDGE_IDS | POSITIONS  # edge IDs / CSC positions the batch needs (else -1 here, unsent)
    is_remote = True

    @functools.cached_property
    def peer(self) -> int:
        """The rank of this partition that answers this rank's requests."""
        return self.layout.server(self.part, self.transport.rank)

    def start(self, nodes: np.ndarray, fanout: int, replace: bool, limits: np.ndarray, strategy: int,
              exclusion: tuple | None, seed: int) -> Callable[[], tuple[Any, ...]]:
        """Send one hop's request for ``nodes`` (their time ``limits``, empty if none; ``seed`` seeds the
        server's draws, so a seeded sampler samples the same wherever it runs); returns a getter of the
        answer as it came over the wire (:func:`sampling.distributed.wire.pack_sample`: counts, neighbours, edge IDs, positions),
        which the driver reads straight into its arrays."""
        future = self.transport.call(self.peer, SAMPLE, self.edge_type, self.part, pack(nodes), fanout, replace,
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
                        SampleOptions(c.weight_attr, c.time_attr, c.message_edges), self._returns(etype)))
                out[etype] = EdgeTopology(etype, topo.src_type, topo.dst_type, blocks, topo.num_src, topo.num_dst)
            self._topology = out
        return self._topology
