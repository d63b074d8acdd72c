"""A rank's node features by global ID: its own partitions' rows (and halo replicas) from storage, the rest
from their owners in one request per remote partition per batch, concurrently, optionally through a cache
of remote rows (:class:`RowCache`). The sampling side is :mod:`sampling.distributed.dist_sampler`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from graphstore.dataset import rowmemory
from graphstore.dataset.opened import Dataset
from graphstore.dataset.stores import ReadOnlyError, asked_ids, FastTensorAttr
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.dist_sampler import RemoteStats, waited
from sampling.distributed.server import GATHER
from sampling.distributed.transport import Transport
from sampling.distributed.wire import pack, unpack

_CACHES_LOCK = threading.Lock()  # guards every RowCache (and their creation): loader threads share a store's caches

class RowCache:
    """A direct-mapped cache of remote node rows (slot = ID mod capacity), vectorised, with counters."""

    def __init__(self, capacity: int, row_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.keys = torch.full((capacity,), -1, dtype=torch.long)
        self.rows = torch.empty((capacity, *row_shape), dtype=dtype)

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hit mask, rows for the hits)``."""
        slots = ids % len(self.keys)
        hit = self.keys[slots] == ids
        return hit, self.rows[slots[hit]]

    def insert(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        slots = ids % len(self.keys)
        self.keys[slots] = ids
        self.rows[slots] = rows


class DistributedFeatureStore(FeatureStore):
    """Node attributes by global ID for a rank: its partitions (own rows + halo replicas), read from
    storage, and the rest from their owners.

    ``cache_rows`` > 0 keeps up to that many remote rows per attribute (hit/miss counts in ``stats``).
    """

    def __init__(self, dataset: Dataset, transport: Transport, layout: RankLayout, stats: RemoteStats | None = None,
                 cache_rows: int = 0) -> None:
        super().__init__(tensor_attr_cls=FastTensorAttr)  # O(1) checks of a batch's index (PyG's compare it whole)
        self.dataset, self.transport, self.layout = dataset, transport, layout
        self.parts = layout.parts_of(transport.rank)
        self.stores = {p: dataset.partition(p)[0] for p in self.parts}
        self.local = self.stores[self.parts[0]]
        self.stats = stats or RemoteStats()
        self.cache_rows = cache_rows
        self._caches: dict[tuple[Any, str], RowCache] = {}
        self.device_cache: Any = None  # a sampling.loader.gpu_cache.DeviceRowCache, set by the trainer (--gpu-cache)
        self._tls = threading.local()  # per loader thread: whether to leave the device cache's hits out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tls"], state["device_cache"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tls = threading.local()

    def compact(self, on: bool) -> np.ndarray | None:
        """With ``on``, this thread's next fetches of the device cache's attribute read only the rows the
        cache does not hold; with ``on`` false, stop, and return the slots of the last such fetch."""
        self._tls.compact = on
        slots = getattr(self._tls, "slots", None)
        self._tls.slots = None
        return None if on else slots

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return self.local.get_all_tensor_attrs()

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        return self.local._get_tensor_size(attr)

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        by_group: dict[tuple, list[int]] = {}
        for i, attr in enumerate(attrs):  # PyG asks every attribute with the same index: one request each
            by_group.setdefault((attr.group_name, id(attr.index)), []).append(i)
        out: list[Any] = [None] * len(attrs)
        for (group, _), which in by_group.items():
            names = [attrs[i].attr_name for i in which]
            for i, tensor in zip(which, self._fetch(group, names, attrs[which[0]].index)):
                out[i] = tensor
        return out

    def _fetch(self, group: Any, names: list[str], index: Any) -> list[torch.Tensor]:
        cache = self.device_cache
        if (cache is None or not getattr(self._tls, "compact", False) or cache.attr not in names
                or self.local._node_info(group).name != cache.node_type or index is None):
            return self._fetch_rows(group, names, index)
        ids = asked_ids(index, 0, 0)
        slots = cache.slots(ids)
        cache.count(slots)
        self._tls.slots = slots
        hit = slots >= 0  # rows neither read here nor sent by a peer (one request per peer all the same)
        out = self._fetch_rows(group, names, torch.from_numpy(ids), skip=(cache.attr, hit))
        return [res[torch.from_numpy(~hit)] if n == cache.attr else res for res, n in zip(out, names)]

    def _fetch_rows(self, group: Any, names: list[str], index: Any,
                    skip: tuple[str, np.ndarray] | None = None) -> list[torch.Tensor]:
        """Rows of ``names`` for ``index``; with ``skip`` (an attribute, a mask over the IDs) that
        attribute's masked rows are left unread (uninitialised in the result)."""
        info = self.local._node_info(group)
        if len(self.parts) == 1 and skip is None:  # the common case: every asked ID one partition's own
            part = self.parts[0]
            lo, hi = info.offsets[part], info.offsets[part + 1]
            ids = asked_ids(index, lo, hi)
            if ids is None or (len(ids) and ids.min() >= lo and ids.max() < hi):
                return [self.local.get_tensor(group, n, index) for n in names]
        else:  # several partitions: ``None`` asks for all of their own rows
            first, last = info.offsets[self.parts[0]], info.offsets[self.parts[-1] + 1]
            ids = asked_ids(index, first, last)
            if ids is None:
                ids = np.arange(first, last, dtype=np.int64)
        ids_t = torch.from_numpy(ids)
        served_by = self._servable_here(info, ids, names)
        local_mask = served_by >= 0
        owners = self.dataset.owner(ids, info.name)
        results = [self._empty(info, n, len(ids)) for n in names]
        pending = self._request_remote(group, names, ids_t, owners, local_mask, results, skip)
        keep = torch.from_numpy(~skip[1]) if skip is not None else None
        for part in self.parts:
            here = served_by == part
            sel = torch.from_numpy(np.flatnonzero(here))
            for res, n in zip(results, names):
                if skip is not None and n == skip[0]:
                    sel_n = torch.from_numpy(np.flatnonzero(here & ~skip[1]))
                    res[sel_n] = self.stores[part].get_tensor(group, n, ids_t[sel_n]) if len(sel_n) else res[sel_n]
                elif len(sel):
                    res[sel] = self.stores[part].get_tensor(group, n, ids_t[sel])
        for sel, future in pending:
            rows = waited(self.stats, future)
            self.stats.add(rows=len(sel))
            for res, r, n in zip(results, rows, names):
                res[sel[keep[sel]] if skip is not None and n == skip[0] else sel] = r
        return results

    def _servable_here(self, info: Any, ids: np.ndarray, names: list[str]) -> np.ndarray:
        """Per ID, the partition of this rank that serves it (its own, else one replicating it for its
        halo when every asked attribute is replicated), or -1 (ask the owner)."""
        served_by = np.full(len(ids), -1, np.int64)
        for part in self.parts:
            lo, hi = info.offsets[part], info.offsets[part + 1]
            served_by[(ids >= lo) & (ids < hi)] = part
        if info.halo_attrs and set(names) <= set(info.halo_attrs):
            from graphstore.dataset import layout

            for part in self.parts:
                halo = np.asarray(self.dataset.array(layout.halo_array(part, info.key, layout.HALO_IDS)))
                if len(halo):
                    pos = np.searchsorted(halo, ids).clip(0, len(halo) - 1)
                    served_by[(served_by < 0) & (halo[pos] == ids)] = part
        return served_by

    def _request_remote(self, group: Any, names: list[str], ids: torch.Tensor, owners: np.ndarray,
                        local_mask: np.ndarray, results: list[torch.Tensor],
                        skip: tuple[str, np.ndarray] | None = None) -> list[tuple[torch.Tensor, Any]]:
        pending = []
        for part in np.unique(owners[~local_mask]):
            sel = torch.from_numpy(np.flatnonzero((owners == part) & ~local_mask))
            sel = self._from_cache(group, names, ids, sel, results)
            if len(sel) == 0:
                continue
            peer = self.layout.server(int(part), self.transport.rank)
            leave = () if skip is None else (skip[0], pack(torch.from_numpy(np.flatnonzero(skip[1][sel.numpy()]))))
            future = self.transport.call(peer, GATHER, group, names, pack(ids[sel]), *((leave,) if leave else ()))
            self.stats.add(requests=1)
            pending.append((sel, _CachingFuture(self, group, names, ids[sel], future)))
        return pending

    def _from_cache(self, group: Any, names: list[str], ids: torch.Tensor, sel: torch.Tensor,
                    results: list[torch.Tensor]) -> torch.Tensor:
        if not self.cache_rows:
            return sel
        with _CACHES_LOCK:  # loader threads: no insert between the two lookups, nor half done during one
            hit = torch.ones(len(sel), dtype=torch.bool)
            for res, n in zip(results, names):
                cache = self._cache(group, n, res)
                h, rows = cache.lookup(ids[sel])
                hit &= h
            for res, n in zip(results, names):  # rows hit in every attribute's cache are served from it
                h, rows = self._cache(group, n, res).lookup(ids[sel[hit]])
                res[sel[hit]] = rows
        with self.stats._lock:
            self.stats.cache_hits += int(hit.sum())
            self.stats.cache_misses += int((~hit).sum())
        return sel[~hit]

    def _cache(self, group: Any, name: str, like: torch.Tensor) -> RowCache:
        key = (group, name)
        if key not in self._caches:
            self._caches[key] = RowCache(self.cache_rows, tuple(like.shape[1:]), like.dtype)
        return self._caches[key]

    def _empty(self, info: Any, name: str, count: int) -> torch.Tensor:
        from graphstore.dataset import layout

        if name == layout.ORIG_ID:
            return torch.empty(count, dtype=torch.long)
        schema = info.attrs[name]
        return rowmemory.empty((count, *schema.shape), getattr(torch, schema.dtype))

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")


class _CachingFuture:
    """Wraps a gather future so the rows it brings are also put into the store's caches."""

    def __init__(self, store: DistributedFeatureStore, group: Any, names: list[str], ids: torch.Tensor,
                 future: Any) -> None:
        self.store, self.group, self.names, self.ids, self.future = store, group, names, ids, future

    def result(self) -> list[torch.Tensor]:
        rows = [unpack(r) for r in self.future.result()]
        if self.store.cache_rows:
            with _CACHES_LOCK:
                for n, r in zip(self.names, rows):
                    self.store._cache(self.group, n, r).insert(self.ids, r)
        return rows
