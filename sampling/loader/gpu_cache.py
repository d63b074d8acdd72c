"""A feature cache in device memory: the rows a rank samples most, kept on its GPU, counted per batch.

The rows are chosen once, before training: the sources of the edges into the rank's own partitions,
ranked by how many of those edges they start (the neighbours its seeds draw first, hubs above all), up
to a size in bytes. For a batch, the rank's feature store reads only the rows the cache does not hold
(a hit never touches host memory: its bytes are neither read nor copied), the batch carries the slots
of its hits, and :meth:`DeviceRowCache.assemble` rebuilds the whole feature matrix on the device:
the same values as a batch built without the cache.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from graphstore.errors import InvalidInputError

SLOTS = "_device_cache_slots"  # the batch attribute holding each row's slot (-1: a miss, sent from the host)


def edge_source_counts(dataset: Any, parts: Any, info: Any, piece: int = 1 << 22) -> np.ndarray:
    """Per node of type ``info`` (global IDs), how many edges into ``parts`` it is the source of: how often
    the seeds of those partitions draw it (hubs first); a partition read unmapped is read ``piece`` edges at
    a time."""
    counts = np.zeros(info.num_nodes, np.int64)
    for etype in dataset.manifest.edge_types:
        if etype.src != info.key:
            continue
        for part in parts:
            for indices in _sources(dataset, part, etype, piece):
                counts += np.bincount(indices, minlength=info.num_nodes)[: info.num_nodes]
    return counts


def _sources(dataset: Any, part: int, etype: Any, piece: int = 1 << 22) -> Any:
    """The sources of partition ``part``'s edges of ``etype`` (its CSC indices): mapped, or for a partition
    read unmapped (``Dataset.read_unmapped``) read with ``pread`` ``piece`` at a time, so counting them maps
    nothing and holds one piece."""
    if part not in getattr(dataset, "unmapped_parts", ()):
        yield np.asarray(dataset.partition(part)[1].csc_arrays(etype.name)[1])
        return
    from graphstore.dataset import layout
    from graphstore.storage.fileio import FileRows

    rows = FileRows(dataset.chunk_files(layout.edge_array(part, etype.key, layout.INDICES)))
    for lo in range(0, len(rows), piece):
        yield rows[lo:lo + piece]


class CacheIndex:
    """Which rows a :class:`DeviceRowCache` holds (``ids``: sorted, unique, of ``attr`` of ``node_type``) and its
    hit and miss counts, without the rows: what a sampler process of the rank needs to leave the hits out of a
    batch (:meth:`DeviceRowCache.index`); it pickles as its IDs."""

    def __init__(self, ids: np.ndarray, node_type: Any = None, attr: str = "x") -> None:
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.node_type, self.attr = node_type, attr
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __reduce__(self) -> tuple:
        return CacheIndex, (self.ids, self.node_type, self.attr)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Each ID's row in the cache, or -1."""
        if not len(self.ids):
            return np.full(len(ids), -1, np.int64)
        pos = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
        return np.where(self.ids[pos] == ids, pos, -1)

    def count(self, slots: np.ndarray) -> None:
        hits = int(np.count_nonzero(slots >= 0))
        self.add(hits, len(slots) - hits)

    def add(self, hits: int, misses: int) -> None:
        """Count ``hits`` and ``misses`` (rows; e.g. a sampler process's, :meth:`counts`)."""
        with self._lock:
            self.hits += hits
            self.misses += misses

    def counts(self, reset: bool = False) -> tuple[int, int]:
        """``(hits, misses)`` since the last reset."""
        with self._lock:
            out = (self.hits, self.misses)
            if reset:
                self.hits = self.misses = 0
        return out


class DeviceRowCache(CacheIndex):
    """Rows ``attr`` of node type ``node_type`` for the IDs ``ids`` (sorted, unique), on ``device``.

    Examples
    --------
    >>> cache = DeviceRowCache.hottest(dataset, store, parts=(0,), size_bytes=2**30, device="cuda:0")  # doctest: +SKIP
    >>> batch = cache.assemble(batch.to("cuda:0"))  # doctest: +SKIP
    """

    def __init__(self, ids: np.ndarray, rows: torch.Tensor, device: Any, node_type: Any = None,
                 attr: str = "x") -> None:
        if len(ids) != len(rows):
            raise InvalidInputError(f"device cache: {len(ids)} IDs for {len(rows)} rows")
        super().__init__(ids, node_type, attr)
        self.device = torch.device(device)
        self.rows = rows.to(self.device)
        self.row_shape, self.dtype = tuple(rows.shape[1:]), rows.dtype

    def __reduce__(self) -> tuple:
        raise TypeError("a DeviceRowCache holds device memory of this process; send its index() instead")

    def index(self) -> CacheIndex:
        """Which rows it holds, for a sampler process (its counts are this cache's to :meth:`add`)."""
        return CacheIndex(self.ids, self.node_type, self.attr)

    @classmethod
    def hottest(cls, dataset: Any, store: Any, parts: tuple[int, ...], size_bytes: int, device: Any,
                node_type: Any = None, attr: str = "x") -> DeviceRowCache:
        """The rows of ``attr`` most often a source of an edge into ``parts``, as many as fit in
        ``size_bytes``; fetched through ``store`` (own rows from storage, the rest from their owners)."""
        info = dataset.manifest.node_type(node_type) if node_type is not None else dataset.manifest.node_types[0]
        if attr not in info.attrs:
            raise InvalidInputError(f"--gpu-cache: node type {info.name!r} has no attribute {attr!r} to cache")
        schema = info.attrs[attr]
        row_bytes = int(np.dtype(schema.dtype).itemsize * int(np.prod(schema.shape or (1,))))
        capacity = min(int(size_bytes) // max(row_bytes, 1), info.num_nodes)
        counts = edge_source_counts(dataset, parts, info)
        order = np.argsort(-counts, kind="stable")[:capacity]
        ids = np.sort(order[counts[order] > 0]) if capacity else np.zeros(0, np.int64)
        rows = store.get_tensor(info.name, attr, torch.from_numpy(ids)) if len(ids) else \
            torch.empty((0, *schema.shape), dtype=getattr(torch, schema.dtype))
        return cls(ids, rows, device, info.name, attr)

    @property
    def nbytes(self) -> int:
        return int(self.rows.numel() * self.rows.element_size())

    def snapshot(self, reset: bool = False) -> dict[str, int]:
        """Hits and misses (rows) since the last reset, and the cache's size."""
        hits, misses = self.counts(reset)
        return {"hits": hits, "misses": misses, "rows": len(self.ids), "bytes": self.nbytes}

    def assemble(self, batch: Any) -> Any:
        """The batch with its full feature matrix, on the cache's device: hits from the cache, misses
        from what the batch brought (only their rows); a batch without slots is returned as it is."""
        store = batch if self.node_type is None or not hasattr(batch, "node_types") else batch[self.node_type]
        slots = getattr(store, SLOTS, None)
        if slots is None:
            return batch
        slots = slots.to(self.device, non_blocking=True)
        misses = store[self.attr].to(self.device, non_blocking=True)
        full = torch.empty((len(slots), *self.row_shape), dtype=self.dtype, device=self.device)
        hit = slots >= 0
        full[hit] = self.rows[slots[hit]]
        full[~hit] = misses
        store[self.attr] = full
        delattr(store, SLOTS)
        return batch
