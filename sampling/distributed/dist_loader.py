"""Distributed node and link loaders: PyG's arguments, remote sampling and features, loader threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphstore.dataset.opened import Dataset
from graphstore.errors import InvalidInputError
from sampling.distributed.dist_features import DistributedFeatureStore
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import DistributedSampler, RemoteStats, waited
from sampling.loader.neighbor_loader import LinkNeighborLoader, NeighborLoader
from sampling.distributed.server import EDGE_ATTR
from sampling.distributed.transport import Transport
from sampling.distributed.wire import pack, unpack

_SAMPLER_OPTIONS = ("replace", "disjoint", "temporal_strategy", "time_attr", "weight_attr", "seed", "subgraph_type",
                    "is_sorted", "message_edges", "exclude_seed_edges", "edge_ids")


class _Distributed:
    """What both distributed loaders share: layout, stats, remote edge attributes. Loader threads,
    prefetching and a pass started mid-way (``skip_next``) are the in-process loaders' (``_Threaded``)."""

    transport: Transport
    layout: RankLayout
    stats: RemoteStats

    def _setup(self, dataset: Dataset, transport: Transport, layout: RankLayout | None, stats: RemoteStats | None,
               num_neighbors: Any, kwargs: dict[str, Any], cache_rows: int) -> tuple:
        self.transport = transport
        self.layout = layout or RankLayout(dataset.num_parts, transport.world_size)
        self.stats = stats or RemoteStats()
        self.parts = self.layout.parts_of(transport.rank)
        self.part = self.parts[0]
        self.sampler_processes = _processes(kwargs)  # num_workers: sampler processes beside this rank
        options = {k: kwargs.pop(k) for k in _SAMPLER_OPTIONS if k in kwargs}
        _refuse_induced(options.get("subgraph_type"), kwargs.get("directed", True))
        sampler = DistributedSampler(dataset, num_neighbors, transport, self.layout, self.stats, **options)
        store = DistributedFeatureStore(dataset, transport, self.layout, self.stats, cache_rows)
        self.features = store  # its device_cache (--gpu-cache) leaves the cache's hits out of every batch
        if "time_attr" in options:
            kwargs["time_attr"] = options["time_attr"]
        return sampler, (store, dataset.partition(self.part)[1])

    def filter_fn(self, out: Any) -> Any:
        """The batch; with a device cache on the feature store, its cached attribute holds only the rows
        the cache misses, and the batch the slot of every row (``DeviceRowCache.assemble`` rebuilds it)."""
        cache = self.features.device_cache
        if cache is None:
            return super().filter_fn(out)  # type: ignore[misc]
        self.features.compact(True)
        try:
            batch = super().filter_fn(out)  # type: ignore[misc]
        finally:
            slots = self.features.compact(False)
        if slots is not None:
            from sampling.loader.gpu_cache import SLOTS

            target = batch[cache.node_type] if cache.node_type is not None and hasattr(batch, "node_types") else batch
            setattr(target, SLOTS, torch.from_numpy(slots))
        return batch

    def _gather_edges(self, etype: Any, name: str, part: np.ndarray, pos: np.ndarray, schema: Any) -> torch.Tensor:
        out = torch.empty((len(pos), *schema.shape), dtype=getattr(torch, schema.dtype))
        pending = []
        for p in np.unique(part):
            sel = torch.from_numpy(np.flatnonzero(part == p))
            positions = torch.from_numpy(pos[sel.numpy()])
            if p in self.parts:
                out[sel] = self._graph_dataset.partition(int(p))[1].edge_attr(name, etype, positions)
            else:
                peer = self.layout.server(int(p), self.transport.rank)
                pending.append((sel, self.transport.call(peer, EDGE_ATTR, etype, name, pack(positions), int(p))))
                self.stats.add(requests=1)
        for sel, future in pending:
            out[sel] = unpack(waited(self.stats, future))
        return out


class DistributedNeighborLoader(_Distributed, NeighborLoader):
    """``NeighborLoader`` for one rank of a distributed job over a partitioned dataset.

    ``input_nodes``: global IDs (this rank's seeds), or a mask name (this rank's partition's nodes
    with the mask set). Batches hold every node attribute and edge attribute, fetched from owners, and
    ``e_id`` unless ``edge_ids=False`` (then remote partitions send no edge IDs: fewer bytes).
    ``loader_threads=N`` samples and gathers N batches at a time in threads of this process (handed out
    in order; with ``seed`` the same batches for every N), ``prefetch`` batches ahead (default 2).

    Examples
    --------
    >>> loader = DistributedNeighborLoader(ds, [15, 10], transport, input_nodes="train_mask",
    ...                                    batch_size=1024, shuffle=True)  # doctest: +SKIP
    """

    def __init__(self, dataset: Dataset, num_neighbors: Any, transport: Transport, input_nodes: Any = None, *,
                 layout: RankLayout | None = None, stats: RemoteStats | None = None, prefetch: int = 2,
                 cache_rows: int = 0, **kwargs: Any) -> None:
        if "exclude_seed_edges" in kwargs:
            raise InvalidInputError("exclude_seed_edges is for link loaders (DistributedLinkNeighborLoader): node "
                                    "batches have no seed links; drop it")
        recipe = dict(kwargs, layout=layout, cache_rows=cache_rows)
        sampler, pair = self._setup(dataset, transport, layout, stats, num_neighbors, kwargs, cache_rows)
        seeds = local_seeds(dataset, self.parts, input_nodes, self.layout, transport.rank)
        self._recipe = (type(self), dataset, num_neighbors, seeds, recipe)
        super().__init__(pair, num_neighbors, input_nodes=seeds, neighbor_sampler=sampler, prefetch=prefetch, **kwargs)
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
        recipe = dict(kwargs, layout=layout, cache_rows=cache_rows)
        self._recipe = (type(self), dataset, num_neighbors, edge_label_index, recipe)
        sampler, pair = self._setup(dataset, transport, layout, stats, num_neighbors, kwargs, cache_rows)
        if edge_label_index is None:
            time_attr = kwargs.get("time_attr")
            timed = bool(time_attr) and kwargs.get("edge_label_time") is None and \
                time_attr in dataset.manifest.edge_types[0].attrs
            edge_label_index, times = local_links(dataset, self.layout, transport.rank, None,
                                                  time_attr if timed else None)
            if timed:
                kwargs["edge_label_time"] = times  # each link at its own time
        if isinstance(edge_label_index, torch.Tensor):
            edge_label_index = (None, edge_label_index)
        super().__init__(pair, num_neighbors, edge_label_index=edge_label_index, neighbor_sampler=sampler,
                         prefetch=prefetch, **kwargs)
        self._graph_dataset = dataset


def _processes(kwargs: dict[str, Any]) -> int:
    """``num_workers=N``: N sampler processes beside this rank (:mod:`sampling.loader.sampler_processes`), taken out of
    what torch's DataLoader sees (its own workers cannot share the rank's RPC agent)."""
    count = kwargs.pop("num_workers", 0)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise InvalidInputError(f"num_workers={count!r}: give an integer >= 0 (sampler processes beside this rank)")
    for name in ("persistent_workers", "multiprocessing_context", "worker_init_fn", "prefetch_factor"):
        if kwargs.get(name) not in (None, False):
            raise InvalidInputError(f"{name} is torch's worker option; a distributed loader's num_workers are "
                                    "sampler processes of its own (spawned once, kept for every pass): drop it")
        kwargs.pop(name, None)
    if count and kwargs.get("loader_threads", 1) > 1:
        raise InvalidInputError(f"loader_threads={kwargs['loader_threads']} with num_workers={count}: both build "
                                "batches in parallel (threads in this process, or sampler processes); give one")
    return int(count)


def _refuse_induced(subgraph_type: Any, directed: Any) -> None:
    if getattr(subgraph_type, "value", subgraph_type) == "induced" or directed is False:
        raise InvalidInputError(
            "subgraph_type='induced' (or directed=False) is not supported by the distributed loaders: the edges "
            "among remote nodes would need every partition's topology in this process; use 'directional' or "
            "'bidirectional'"
        )


def local_links(dataset: Dataset, layout: RankLayout, rank: int, edge_type: Any = None,
                time_attr: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's links of ``edge_type`` (global IDs, ``[2, n]``) and their ``time_attr`` values (or
    ``None``): the stored edges of its partitions, split between the ranks that share a partition."""
    index, times = [], []
    for part in layout.parts_of(rank):
        gs = dataset.partition(part)[1]
        indices, indptr = gs.get_edge_index(edge_type, "csc")
        lo, hi = gs.dst_range(edge_type)
        share, ranks = layout.share(rank, part)
        dst = torch.repeat_interleave(torch.arange(lo, hi), torch.diff(indptr))
        index.append(torch.stack([indices, dst])[:, share::ranks])
        if time_attr:
            times.append(gs.edge_attr(time_attr, edge_type)[share::ranks])
    return torch.cat(index, dim=1), torch.cat(times) if time_attr else None


def local_seeds(dataset: Dataset, parts: int | tuple[int, ...], input_nodes: Any, layout: RankLayout | None = None,
                rank: int | None = None, node_type: Any = None) -> Any:
    """This rank's seed nodes: ``input_nodes`` as given, or a mask name / ``None`` resolved on its
    partitions (global IDs); with several ranks per partition, the partition's seeds are split
    between them (``rank`` picks the share)."""
    if input_nodes is not None and not isinstance(input_nodes, str):
        return input_nodes
    info = dataset.manifest.node_type(node_type) if node_type is not None else dataset.manifest.node_types[0]
    found = []
    for part in (parts,) if isinstance(parts, int) else parts:
        fs = dataset.partition(part)[0]
        lo = info.offsets[part]
        if input_nodes is None:
            ids = torch.arange(lo, info.offsets[part + 1])
        else:
            ids = fs[info.name, input_nodes, None].nonzero().view(-1) + lo
        if layout is not None and rank is not None:
            share, ranks = layout.share(rank, part)
            ids = ids[share::ranks]
        found.append(ids)
    ids = torch.cat(found)
    return ids
