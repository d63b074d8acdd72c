"""Feature and graph stores over a whole dataset on one machine: requests are routed to the owners."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from graphstore.dataset import layout, rowgather, rowmemory
from graphstore.dataset.opened import Dataset
from graphstore.errors import NotOwnedError, UnknownAttributeError
from graphstore.dataset.stores import ReadOnlyError, ZarrFeatureStore, asked_ids, FastTensorAttr


class DatasetFeatureStore(FeatureStore):
    """Node attributes of every partition, by global ID; each ID is read from its owner's arrays.

    Examples
    --------
    >>> fs = DatasetFeatureStore(graphstore.open_dataset("/data/cora"))  # doctest: +SKIP
    >>> fs[None, "x", torch.tensor([0, 2000])].shape  # doctest: +SKIP
    torch.Size([2, 1433])
    """

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(tensor_attr_cls=FastTensorAttr)
        self.dataset = dataset
        self._parts = [ZarrFeatureStore(dataset, p) for p in range(dataset.num_parts)]
        self._views: dict[tuple[Any, str], tuple[np.ndarray, ...] | None] = {}

    def __repr__(self) -> str:
        return f"DatasetFeatureStore({self.dataset.url!r})"

    def _info(self, group: Any) -> Any:
        if group is None and not self.dataset.is_hetero:
            return self.dataset.manifest.node_types[0]
        return self.dataset.manifest.node_type(group)

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        info = self._info(attr.group_name)
        if attr.attr_name not in info.attrs and attr.attr_name != layout.ORIG_ID:
            raise UnknownAttributeError(
                f"{attr.group_name!r} has no attribute {attr.attr_name!r}; it has {sorted(info.attrs)}")
        ids = asked_ids(attr.index, 0, info.num_nodes)
        if ids is not None and len(ids) and (ids.min() < 0 or ids.max() >= info.num_nodes):
            bad = ids[(ids < 0) | (ids >= info.num_nodes)]
            raise NotOwnedError(f"node IDs {bad[:5].tolist()} of {info.name!r} are outside [0, {info.num_nodes}): "
                                "pass global IDs of this dataset")
        if ids is None:
            return torch.cat([fs.get_tensor(info.name, attr.attr_name, None) for fs in self._parts])
        views = self._word_views(info, attr.attr_name) if self.dataset.num_parts > 1 and len(ids) else None
        if views is not None:  # every partition mapped locally: one pass, rows copied straight to place
            orig = attr.attr_name == layout.ORIG_ID
            schema = None if orig else info.attrs[attr.attr_name]
            out = rowmemory.empty((len(ids), *(() if orig else schema.shape)),  # pinned when a GPU's loader asks
                                  torch.int64 if orig else getattr(torch, schema.dtype))
            rowgather.gather(views, np.asarray(info.offsets), ids, out.numpy())
            return out
        owners = self.dataset.owner(ids, info.name) if self.dataset.num_parts > 1 else np.zeros(len(ids), np.int64)
        if len(ids) == 0 or (owners == owners[0]).all():
            part = int(owners[0]) if len(ids) else 0
            return self._parts[part].get_tensor(info.name, attr.attr_name, torch.from_numpy(ids))
        pieces, order = [], []
        for part in np.unique(owners):
            sel = np.flatnonzero(owners == part)
            pieces.append(self._parts[int(part)].get_tensor(info.name, attr.attr_name, torch.from_numpy(ids[sel])))
            order.append(sel)
        out = torch.empty((len(ids), *pieces[0].shape[1:]), dtype=pieces[0].dtype)
        out[torch.from_numpy(np.concatenate(order))] = torch.cat(pieces)
        return out

    def _word_views(self, info: Any, name: str) -> tuple[np.ndarray, ...] | None:
        """Each partition's rows of ``name`` as word views (cached), or ``None`` if some partition's
        rows are not a local mapped array (remote datasets read through their lazy chunk cache)."""
        key = (info.name, name)
        if key not in self._views:
            if self.dataset.num_parts > rowgather.MAX_PARTS:
                return None
            arrays = [self.dataset.array(layout.node_array(p, info.key, name)) for p in range(self.dataset.num_parts)]
            if not all(isinstance(a, np.ndarray) for a in arrays):
                return None  # not cached: a remote array becomes a plain one once all its chunks are here
            self._views[key] = rowgather.word_views(arrays)
        return self._views[key]

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        info = self._info(attr.group_name)
        shape = () if attr.attr_name == layout.ORIG_ID else info.attrs[attr.attr_name].shape
        return (info.num_nodes, *shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return self._parts[0].get_all_tensor_attrs()

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"])  # type: ignore[misc]


class DatasetGraphStore(GraphStore):
    """All edges of a dataset (every partition's CSC, concatenated in global destination order)."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__()
        self.dataset = dataset

    @property
    def dataset_parts(self) -> tuple[Dataset, list[int]]:
        """The dataset and the partitions this store serves (all): samplers memory-map their topology."""
        return self.dataset, list(range(self.dataset.num_parts))

    def __repr__(self) -> str:
        return f"DatasetGraphStore({self.dataset.url!r})"

    def _parts_csc(self, edge_type: Any) -> tuple[np.ndarray, np.ndarray]:
        indptrs, indices = [np.zeros(1, np.int64)], []
        total = 0
        for p in range(self.dataset.num_parts):
            ptr, idx, _ = self.dataset.partition(p)[1].csc_arrays(edge_type)
            indptrs.append(np.asarray(ptr[1:]) + total)
            indices.append(np.asarray(idx))
            total += len(idx)
        return np.concatenate(indptrs), np.concatenate(indices)

    def edge_ids(self, edge_type: Any = None) -> torch.Tensor:
        """Input edge IDs of every edge, in the order of ``get_edge_index``."""
        return torch.cat([self.dataset.partition(p)[1].edge_ids(edge_type) for p in range(self.dataset.num_parts)])

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor]:
        indptr, indices = self._parts_csc(edge_attr.edge_type)
        if edge_attr.layout == EdgeLayout.CSC:
            return torch.from_numpy(indices), torch.from_numpy(indptr)
        if edge_attr.layout == EdgeLayout.COO:
            dst = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
            return torch.from_numpy(indices), torch.from_numpy(dst)
        raise UnknownAttributeError(f"layout {edge_attr.layout.value!r} is not stored; ask for 'csc' or 'coo'")

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        out = []
        for info in self.dataset.manifest.edge_types:
            src = next(t for t in self.dataset.manifest.node_types if t.key == info.src)
            dst = next(t for t in self.dataset.manifest.node_types if t.key == info.dst)
            out.append(EdgeAttr(info.name, EdgeLayout.CSC, True, (src.num_nodes, dst.num_nodes)))
        return out

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyError(f"{self.dataset.url} is read-only; datasets are written once by `graphstore ingest`")
