"""Distributed node and link loaders: PyG's arguments, remote sampling and features, async prefetch."""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import numpy as np
import torch

from graphstore.dataset import Dataset
from graphstore.errors import InvalidInputError
from sampling.distributed import (EDGE_ATTR, DistributedFeatureStore, DistributedSampler, RankLayout, RemoteStats,
                                  _waited)
from sampling.loader import LinkNeighborLoader, NeighborLoader
from sampling.transport import Transport
from sampling.wire import pack, unpack

_SAMPLER_OPTIONS = ("replace", "disjoint", "temporal_strategy", "time_attr", "weight_attr", "seed", "subgraph_type",
                    "is_sorted", "message_edges", "exclude_seed_edges", "edge_ids")


class Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead, so sampling and remote
    fetches overlap training. Errors are re-raised in the consumer; ``close`` stops and joins the
    thread (also on garbage collection), and a finished prefetcher keeps raising ``StopIteration``.
    """

    _DONE = object()

    def __init__(self, source: Iterator, depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True, name="graphstore-prefetch")
        self._thread.start()

    def _put(self, item: Any) -> bool:
        """Queue ``item`` unless asked to stop; False when stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(self._DONE)
        except BaseException as exc:  # delivered to the consumer
            self._put(exc)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is self._DONE or isinstance(item, BaseException):
            self._finished = True
            self.close()
            if item is self._DONE:
                raise StopIteration
            raise item
        return item

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread and wait for it (it finishes the batch it is on: bounded by RPC timeouts)."""
        self._stop.set()
        while True:  # unblock a producer waiting for room
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __del__(self) -> None:
        self._stop.set()


class _Distributed:
    """What both distributed loaders share: layout, stats, remote edge attributes, prefetching."""

    transport: Transport
    layout: RankLayout
    stats: RemoteStats
    prefetch: int

    def _setup(self, dataset: Dataset, transport: Transport, layout: RankLayout | None, stats: RemoteStats | None,
               num_neighbors: Any, kwargs: dict[str, Any], cache_rows: int) -> tuple:
        self.transport = transport
        self.layout = layout or RankLayout(dataset.num_parts, transport.world_size)
        self.stats = stats or RemoteStats()
        self.part = self.layout.part_of(transport.rank)
        if kwargs.get("num_workers", 0):
            raise InvalidInputError(
                "distributed loaders sample in this process (its RPC agent cannot be shared with DataLoader "
                "workers); drop num_workers — a background thread already prefetches (prefetch=2)"
            )
        options = {k: kwargs.pop(k) for k in _SAMPLER_OPTIONS if k in kwargs}
        _refuse_induced(options.get("subgraph_type"), kwargs.get("directed", True))
        sampler = DistributedSampler(dataset, num_neighbors, transport, self.layout, self.stats, **options)
        store = DistributedFeatureStore(dataset, transport, self.layout, self.stats, cache_rows)
        if "time_attr" in options:
            kwargs["time_attr"] = options["time_attr"]
        return sampler, (store, dataset.partition(self.part)[1])

    def _gather_edges(self, etype: Any, name: str, part: np.ndarray, pos: np.ndarray, schema: Any) -> torch.Tensor:
        out = torch.empty((len(pos), *schema.shape), dtype=getattr(torch, schema.dtype))
        pending = []
        for p in np.unique(part):
            sel = torch.from_numpy(np.flatnonzero(part == p))
            positions = torch.from_numpy(pos[sel.numpy()])
            if p == self.part:
                out[sel] = self._graph_dataset.partition(int(p))[1].edge_attr(name, etype, positions)
            else:
                peer = self.layout.server(int(p), self.transport.rank)
                pending.append((sel, self.transport.call(peer, EDGE_ATTR, etype, name, pack(positions))))
                self.stats.add(requests=1)
        for sel, future in pending:
            out[sel] = unpack(_waited(self.stats, future))
        return out

    skip_next = 0  # the next pass starts this many batches in (a job resumed mid-epoch); then back to 0

    def __iter__(self) -> Iterator:
        base = super().__iter__()  # type: ignore[misc]
        skip, self.skip_next = self.skip_next, 0
        inner = getattr(base, "iterator", base)  # PyG's DataLoaderIterator wraps torch's
        for _ in range(skip):  # the seed order is drawn as in a whole pass; skipped batches are not sampled
            inner._next_index()
        return Prefetcher(base, self.prefetch) if self.prefetch else base


class DistributedNeighborLoader(_Distributed, NeighborLoader):
    """``NeighborLoader`` for one rank of a distributed job over a partitioned dataset.

    ``input_nodes``: global IDs (this rank's seeds), or a mask name (this rank's partition's nodes
    with the mask set). Batches hold every node attribute and edge attribute, fetched from owners, and
    ``e_id`` unless ``edge_ids=False`` (then remote partitions send no edge IDs: fewer bytes).

    Examples
    --------
    >>> loader = DistributedNeighborLoader(ds, [15, 10], transport, input_nodes="train_mask",
    ...                                    batch_size=1024, shuffle=True)  # doctest: +SKIP
    """

    def __init__(self, dataset: Dataset, num_neighbors: Any, transport: Transport, input_nodes: Any = None, *,
                 layout: RankLayout | None = None, stats: RemoteStats | None = None, prefetch: int = 2,
                 cache_rows: int = 0, **kwargs: Any) -> None:
        self.prefetch = prefetch
        if "exclude_seed_edges" in kwargs:
            raise InvalidInputError("exclude_seed_edges is for link loaders (DistributedLinkNeighborLoader): node "
                                    "batches have no seed links; drop it")
        sampler, pair = self._setup(dataset, transport, layout, stats, num_neighbors, kwargs, cache_rows)
        seeds = local_seeds(dataset, self.part, input_nodes, self.layout, transport.rank)
        super().__init__(pair, num_neighbors, input_nodes=seeds, neighbor_sampler=sampler, **kwargs)
        self._graph_dataset = dataset


class DistributedLinkNeighborLoader(_Distributed, LinkNeighborLoader):
    """``LinkNeighborLoader`` for one rank: ``edge_label_index`` holds this rank's seed links (global IDs).

    With ``time_attr`` and no ``edge_label_time``, each seed link is sampled at its own edge time (by
    default) or each endpoint at its own node time.
    """

    _pyg_time_rule = False

    def __init__(self, dataset: Dataset, num_neighbors: Any, transport: Transport, edge_label_index: Any = None, *,
                 layout: RankLayout | None = None, stats: RemoteStats | None = None, prefetch: int = 2,
                 cache_rows: int = 0, **kwargs: Any) -> None:
        self.prefetch = prefetch
        sampler, pair = self._setup(dataset, transport, layout, stats, num_neighbors, kwargs, cache_rows)
        if edge_label_index is None:
            indices, indptr = pair[1].get_edge_index(None, "csc")
            lo, hi = pair[1].dst_range()
            dst = torch.repeat_interleave(torch.arange(lo, hi), torch.diff(indptr))
            share, ranks = transport.rank % self.layout.ranks_per_part, self.layout.ranks_per_part
            edge_label_index = torch.stack([indices, dst])[:, share::ranks]  # the partition's ranks split its links
            time_attr = kwargs.get("time_attr")
            if time_attr and kwargs.get("edge_label_time") is None and time_attr in dataset.manifest.edge_types[0].attrs:
                kwargs["edge_label_time"] = pair[1].edge_attr(time_attr)[share::ranks]  # each link at its own time
        if isinstance(edge_label_index, torch.Tensor):
            edge_label_index = (None, edge_label_index)
        super().__init__(pair, num_neighbors, edge_label_index=edge_label_index, neighbor_sampler=sampler, **kwargs)
        self._graph_dataset = dataset


def _refuse_induced(subgraph_type: Any, directed: Any) -> None:
    if getattr(subgraph_type, "value", subgraph_type) == "induced" or directed is False:
        raise InvalidInputError(
            "subgraph_type='induced' (or directed=False) is not supported by the distributed loaders: the edges "
            "among remote nodes would need every partition's topology in this process; use 'directional' or "
            "'bidirectional'"
        )


def local_seeds(dataset: Dataset, part: int, input_nodes: Any, layout: RankLayout | None = None,
                rank: int | None = None, node_type: Any = None) -> Any:
    """This rank's seed nodes: ``input_nodes`` as given, or a mask name / ``None`` resolved on its
    partition (global IDs); with several ranks per partition, the partition's seeds are split
    between them (``rank`` picks the share)."""
    if input_nodes is not None and not isinstance(input_nodes, str):
        return input_nodes
    info = dataset.manifest.node_type(node_type) if node_type is not None else dataset.manifest.node_types[0]
    fs = dataset.partition(part)[0]
    lo = info.offsets[part]
    if input_nodes is None:
        ids = torch.arange(lo, info.offsets[part + 1])
    else:
        ids = fs[info.name, input_nodes, None].nonzero().view(-1) + lo
    if layout is not None and rank is not None and layout.ranks_per_part > 1:
        share = rank % layout.ranks_per_part
        ids = ids[share:: layout.ranks_per_part]
    return ids
