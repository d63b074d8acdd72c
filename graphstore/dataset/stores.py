"""PyG ``FeatureStore`` and ``GraphStore`` over one partition of a graphstore dataset (read-only)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from graphstore.dataset import layout, rowmemory
from graphstore.dataset.manifest import Manifest
from graphstore.errors import GraphstoreError, NotOwnedError, UnknownAttributeError
from graphstore.storage.diskrows import ColdStart, RowReader
from graphstore.heap import keep_freed_memory


class Dataset(Protocol):
    """What a store reads of the dataset it serves: ``graphstore.dataset.opened.Dataset`` is one, and it
    builds its stores (``Dataset.partition``), so the stores name it by what they use, not by import."""

    manifest: Manifest

    @property
    def url(self) -> str: ...

    @property
    def is_hetero(self) -> bool: ...

    def check_part(self, part: int) -> int: ...

    def array(self, path: str) -> Any: ...

    def owner(self, ids: Any, ntype: Any = None) -> np.ndarray: ...

    def topology(self, part: int, edge_type: Any = None) -> tuple[Any, ...]: ...


class ReadOnlyError(GraphstoreError, PermissionError):
    """A write to a dataset store; datasets are written once, by ingest."""


def _tensor(array: Any) -> torch.Tensor:
    array = np.asarray(array)
    if not array.flags.writeable:  # torch warns on read-only arrays; ours are copy-on-write or copies
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    return torch.from_numpy(array)


_UNSET = TensorAttr().attr_name  # PyG's marker of a field not given (every field of a bare TensorAttr)


class FastTensorAttr(TensorAttr):
    """PyG's ``TensorAttr`` with an O(1) ``is_set`` (PyG's compares the index tensor element-wise)."""

    def is_set(self, key: str) -> bool:
        return getattr(self, key) is not _UNSET


@dataclass(frozen=True)
class _Reader:
    """One resolved attribute of a partition: its type info, rows (array and tensor view) and own range."""

    info: Any
    name: str
    rows: Any
    rows_t: torch.Tensor | None  # zero-copy tensor over the mapped rows (None for zarr-read arrays)
    lo: int
    hi: int
    cold: ColdStart | None = None  # a large mapped array: its pages asked for ahead while the page cache is cold


def asked_ids(index: Any, lo: int, hi: int) -> np.ndarray | None:
    """Global IDs asked for, as int64 numpy (``None`` = all own rows)."""
    if index is None:
        return None
    if isinstance(index, slice):
        start, stop, step = index.indices(hi)
        return np.arange(start, stop, step, dtype=np.int64)
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    ids = np.asarray(index)
    if ids.dtype == np.bool_:
        raise UnknownAttributeError("boolean masks are not node IDs; pass mask.nonzero() (global IDs) instead")
    return ids.astype(np.int64, copy=False).reshape(-1)


class ZarrFeatureStore(FeatureStore):
    """Node attributes of partition ``part``: its own rows (global IDs) and replicated halo rows.

    ``store[ntype, attr, ids]`` takes global IDs (``None`` = every own row in global-ID order). For a
    homogeneous graph ``ntype`` is ``None``. Edge attributes live with the edges:
    :meth:`ZarrGraphStore.edge_attr`.
    """

    def __init__(self, dataset: Dataset, part: int) -> None:
        super().__init__(tensor_attr_cls=FastTensorAttr)
        keep_freed_memory()  # every batch allocates its rows anew (often hundreds of MB)
        self.dataset, self.part = dataset, dataset.check_part(part)
        self._readers: dict[tuple[Any, str], _Reader] = {}

    def __repr__(self) -> str:
        return f"ZarrFeatureStore({self.dataset.url!r}, part={self.part})"

    def _node_info(self, group: Any) -> Any:
        if group is None and not self.dataset.is_hetero:
            return self.dataset.manifest.node_types[0]
        return self.dataset.manifest.node_type(group)

    def _reader(self, group: Any, name: str) -> _Reader:
        found = self._readers.get((group, name))
        if found is None or found.rows_t is None and getattr(found.rows, "complete", False):
            # new, or a remote array whose chunks have all arrived: from now on the local hot path
            info = self._node_info(group)
            if name not in info.attrs and name != layout.ORIG_ID:
                raise UnknownAttributeError(f"{group!r} has no attribute {name!r}; it has {sorted(info.attrs)}")
            rows = self.dataset.array(layout.node_array(self.part, info.key, name))
            rows_t = _tensor(rows) if isinstance(rows, np.ndarray) else None
            found = _Reader(info, name, rows, rows_t, info.offsets[self.part], info.offsets[self.part + 1],
                            ColdStart(rows) if rows_t is not None and ColdStart.applies(rows) else None)
            self._readers[(group, name)] = found
        return found

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        r = self._reader(attr.group_name, attr.attr_name)
        index = attr.index
        if index is None:
            return r.rows_t if r.rows_t is not None else _tensor(r.rows)
        if (r.rows_t is not None and isinstance(index, torch.Tensor) and index.dtype == torch.int64
                and index.dim() == 1 and index.device.type == "cpu"):
            try:  # the hot path: own rows, one bounds-checked index_select on mapped memory
                out = rowmemory.empty((len(index), *r.rows_t.shape[1:]), r.rows_t.dtype)  # pinned for a GPU's loader
                if r.cold is not None:
                    return r.cold.index_select(r.rows_t, index - r.lo, out)
                return torch.index_select(r.rows_t, 0, index - r.lo, out=out)
            except (IndexError, RuntimeError):
                pass  # some IDs are not own rows: halo replicas or an error naming the owner, below
        ids = asked_ids(index, r.lo, r.hi)
        if isinstance(r.rows, RowReader) and rowmemory.placed() and len(ids) and ids.min() >= r.lo \
                and ids.max() < r.hi:  # own rows read from disk straight into a sampler process's block, or pinned
            return r.rows.gather(ids - r.lo, rowmemory.empty((len(ids), *r.rows.shape[1:]), r.rows.tensor_dtype))
        return _tensor(self._gather(r.info, r.name, r.rows, ids, r.lo, r.hi))

    def _gather(self, info: Any, name: str, rows: Any, ids: np.ndarray, lo: int, hi: int) -> np.ndarray:
        # ``rows`` of a remote dataset is a LazyRows: indexing it first ensures the rows (fetching the
        # missing chunks concurrently into the cache and mapping them), then does one fancy index
        if len(ids) and ids.min() >= lo and ids.max() < hi:  # the hot path: all own rows
            return rows[ids - lo]
        own = (ids >= lo) & (ids < hi)
        out = np.empty((len(ids), *rows.shape[1:]), dtype=rows.dtype)
        out[own] = rows[ids[own] - lo]
        rest = ids[~own]
        if len(rest):
            out[~own] = self._halo_rows(info, name, rest)
        return out

    def _halo_rows(self, info: Any, name: str, ids: np.ndarray) -> np.ndarray:
        halo_ids = np.asarray(self.dataset.array(layout.halo_array(self.part, info.key, layout.HALO_IDS)))
        pos = np.searchsorted(halo_ids, ids).clip(0, max(len(halo_ids) - 1, 0))
        found = (halo_ids[pos] == ids) if len(halo_ids) else np.zeros(len(ids), bool)
        if name not in info.halo_attrs or not found.all():
            missing = ids[~found] if name in info.halo_attrs else ids
            owners = np.unique(self.dataset.owner(missing.clip(0, info.num_nodes - 1), info.name))
            bad = missing[(missing < 0) | (missing >= info.num_nodes)]
            detail = (f"IDs {bad[:5].tolist()} are outside [0, {info.num_nodes})" if len(bad) else
                      f"they are owned by partition(s) {owners.tolist()}")
            raise NotOwnedError(
                f"partition {self.part} cannot serve {name!r} for {len(missing)} node IDs of {info.name!r} "
                f"(e.g. {missing[:5].tolist()}): {detail}; ask the owning partition's store"
            )
        return self.dataset.array(layout.halo_array(self.part, info.key, name))[pos]

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        info = self._node_info(attr.group_name)
        lo, hi = info.offsets[self.part], info.offsets[self.part + 1]
        shape = (() if attr.attr_name == layout.ORIG_ID else info.attrs[attr.attr_name].shape)
        return (hi - lo, *shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        out = []
        for info in self.dataset.manifest.node_types:
            for name in [*info.attrs, layout.ORIG_ID]:
                out.append(FastTensorAttr(info.name, name))
        return out

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "part": self.part}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], state["part"])  # type: ignore[misc]


class ZarrGraphStore(GraphStore):
    """Edges of partition ``part``: every edge whose destination the partition owns.

    CSC: ``(indices, indptr)``, indices global source IDs, indptr over the partition's own
    destination range. COO: ``(src, dst)`` in global IDs.
    """

    def __init__(self, dataset: Dataset, part: int) -> None:
        super().__init__()
        self.dataset, self.part = dataset, dataset.check_part(part)

    @property
    def dataset_parts(self) -> tuple[Dataset, list[int]]:
        """The dataset and the partitions this store serves: samplers memory-map their topology."""
        return self.dataset, [self.part]

    def __repr__(self) -> str:
        return f"ZarrGraphStore({self.dataset.url!r}, part={self.part})"

    def csc_arrays(self, edge_type: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, indices, eid)`` as numpy arrays (memory-mapped, zero copy) for samplers."""
        return self.dataset.topology(self.part, edge_type)[:3]

    def packed_csc(self, edge_type: Any = None) -> np.ndarray | None:
        """The optional int32 ``[m, 2]`` (source ID, edge ID) pairs in CSC order (FORMAT.md), flattened
        to ``[2m]`` (memory-mapped, zero copy); ``None`` when the dataset has none (IDs ≥ 2**31)."""
        packed = self.dataset.topology(self.part, edge_type)[3]
        return None if packed is None else packed.reshape(-1)

    def dst_range(self, edge_type: Any = None) -> tuple[int, int]:
        """The global IDs ``[lo, hi)`` of the destination nodes this partition owns."""
        info = self.dataset.manifest.edge_type(edge_type)
        dst = next(t for t in self.dataset.manifest.node_types if t.key == info.dst)
        return dst.offsets[self.part], dst.offsets[self.part + 1]

    def edge_ids(self, edge_type: Any = None) -> torch.Tensor:
        """The input edge ID (position in the ingested edge list) of every edge, in CSC order."""
        return _tensor(self.csc_arrays(edge_type)[2])

    def edge_attr(self, name: str, edge_type: Any = None, index: Any = None) -> torch.Tensor:
        """Edge attribute ``name`` of this partition's edges in CSC order (``index``: local positions)."""
        info = self.dataset.manifest.edge_type(edge_type)
        if name not in info.attrs:
            raise UnknownAttributeError(f"edge type {edge_type!r} has no attribute {name!r}; it has {sorted(info.attrs)}")
        rows = self.dataset.array(layout.edge_array(self.part, info.key, name))
        return _tensor(rows if index is None else rows[asked_ids(index, 0, len(rows))])

    def _size(self, edge_type: Any) -> tuple[int, int]:
        info = self.dataset.manifest.edge_type(edge_type)
        src = next(t for t in self.dataset.manifest.node_types if t.key == info.src)
        lo, hi = self.dst_range(edge_type)
        return src.num_nodes, hi - lo

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor]:
        indptr, indices, _ = self.csc_arrays(edge_attr.edge_type)
        if edge_attr.layout == EdgeLayout.CSC:
            return _tensor(indices), _tensor(indptr)
        if edge_attr.layout == EdgeLayout.COO:
            lo, hi = self.dst_range(edge_attr.edge_type)
            dst = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr))
            return _tensor(indices), torch.from_numpy(dst)
        raise UnknownAttributeError(f"layout {edge_attr.layout.value!r} is not stored; ask for 'csc' or 'coo'")

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [EdgeAttr(info.name, EdgeLayout.CSC, True, self._size(info.name))
                for info in self.dataset.manifest.edge_types]

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "part": self.part}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], state["part"])  # type: ignore[misc]
