"""The graph a sampler walks: per edge type, CSC blocks that each own a contiguous destination range."""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphstore.errors import InvalidInputError, NotOwnedError
from graphstore.storage.mapped import advise_huge_pages

_EMPTY_I = np.zeros(0, np.int64)
_MADV_WILLNEED, _MADV_POPULATE_READ = 3, 22
_EMPTY_F = np.zeros(0, np.float64)
_EMPTY_I32 = np.zeros(0, np.int32)
_INT32_MAX = 2**31 - 1
_EMPTY_I8 = np.zeros(0, np.int8)


@dataclass(frozen=True)
class CSCBlock:
    """Incoming edges of the destination nodes ``[lo, hi)``: CSC arrays plus optional weight and time."""

    lo: int
    hi: int
    indptr: np.ndarray
    indices: np.ndarray
    eid: np.ndarray
    weight: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    time: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    part: int = 0
    packed: np.ndarray = field(default_factory=lambda: _EMPTY_I32)  # int32 [2m] (source, edge ID) pairs, or empty
    split: np.ndarray = field(default_factory=lambda: _EMPTY_I8)  # link split per CSC position (empty: no mask)
    allowed: int = 0  # bit v set: edges of split v carry messages (used when split is not empty)
    origin: str = ""  # what the arrays are (a dataset's, by checksum): derived arrays are cached under it
    cache_dir: str | None = None  # where derived arrays of a dataset block are stored (with origin)
    files: Any = None  # (indptr, packed) ChunkFiles: the block is read with pread, not mapped (Dataset.read_unmapped)
    edges: int = 0  # a block read with pread: its edge count (its indptr, indices, eid and packed are empty)
    is_remote = False

    @property
    def num_edges(self) -> int:
        """The block's edges: ``len(indices)``, or those of a block read with ``pread``, whose arrays are empty."""
        return self.edges if self.files is not None else len(self.indices)


@dataclass
class EdgeTopology:
    """One edge type: its blocks in destination order (``offsets`` = each block's ``lo``, then ``hi``)."""

    edge_type: Any
    src_type: Any
    dst_type: Any
    blocks: list[CSCBlock]
    num_src: int
    num_dst: int

    def __post_init__(self) -> None:
        self.offsets = np.array([b.lo for b in self.blocks] + [self.blocks[-1].hi], np.int64)

    @property
    def has_weight(self) -> bool:  # remote blocks carry no arrays: ask a local one
        return any(len(getattr(b, "weight", ())) > 0 for b in self.blocks)

    @property
    def has_time(self) -> bool:
        return any(len(getattr(b, "time", ())) > 0 for b in self.blocks)

    def block_of(self, nodes: np.ndarray) -> np.ndarray:
        """Index of the block owning each destination node; raises for nodes no block owns."""
        which = np.searchsorted(self.offsets, nodes, side="right") - 1
        bad = (which < 0) | (which >= len(self.blocks)) | (nodes >= self.offsets[-1])
        if bad.any():
            raise NotOwnedError(
                f"edge type {self.edge_type!r}: nodes {nodes[bad][:5].tolist()} have no incoming edges here "
                f"(this sampler holds destinations {self.offsets[0]}..{self.offsets[-1] - 1}); sample over the "
                "whole dataset (pass graphstore.open_dataset(...)) or use the distributed loader"
            )
        return which


def prefault(array: np.ndarray) -> None:
    """Map every page of ``array`` into this process now (``MADV_POPULATE_READ``; Linux ≥ 5.14).

    The sampler reads topology at random: without this each first touch of a 4 KiB page is a page
    fault inside the hot loop. Best effort: silently does nothing where unsupported.
    """
    if os.name != "posix" or array.nbytes == 0:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        start = array.ctypes.data // page * page
        length = array.ctypes.data + array.nbytes - start
        advise_huge_pages(array)  # before the pages are read in (a no-op where the mapping was advised already)
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_POPULATE_READ) != 0:
            libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_WILLNEED)
    except (OSError, AttributeError):
        pass


def in_huge_pages(array: np.ndarray) -> np.ndarray:
    """``array`` copied into an anonymous mapping of its own that asks for transparent huge pages before
    any page is written (Linux; else, or under 4 MiB, ``array`` itself).

    The sampler reads its topology at random: with 4 KiB pages nearly every read also misses the TLB.
    A heap array gets huge pages only where its memory happens to lie in a range advised earlier (or
    after khugepaged gets to it), so the speed of a sampler over an in-memory graph varied between
    processes (up to a fifth for the same batches); advised before the first write, every page faults
    in huge where the kernel allows it.
    """
    if os.name != "posix" or array.nbytes < (4 << 20) or not hasattr(mmap, "MADV_HUGEPAGE"):
        return array
    try:
        region = mmap.mmap(-1, array.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return array
    out = np.frombuffer(region, dtype=array.dtype, count=array.size).reshape(array.shape)
    out[...] = array
    return out


def _csc_from_coo(src: np.ndarray, dst: np.ndarray, num_src: int, num_dst: int) -> tuple[np.ndarray, ...]:
    perm = np.argsort(dst.astype(np.int64) * max(num_src, 1) + src, kind="stable")
    indptr = np.zeros(num_dst + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, src[perm].astype(np.int64), perm.astype(np.int64)


def _pack(indices: np.ndarray, eid: np.ndarray, num_src: int) -> np.ndarray:
    """The packed int32 (source, edge ID) pairs of an in-memory graph, or empty when IDs do not fit."""
    if num_src > _INT32_MAX or len(eid) == 0 or int(eid.max()) > _INT32_MAX:
        return _EMPTY_I32
    return np.stack([indices, eid], axis=1).astype(np.int32).reshape(-1)


def _np(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def is_hetero_pyg(data: Any) -> bool:
    """Whether ``data`` is a ``HeteroData`` (also with no edge types), rather than a ``Data``."""
    from torch_geometric.data import HeteroData

    return isinstance(data, HeteroData)


def _coo(store: Any) -> tuple[np.ndarray, np.ndarray]:
    """The edge list of a PyG edge store; none (a ``Data`` of isolated nodes) is an empty one."""
    edge_index = getattr(store, "edge_index", None)
    if edge_index is None:
        return _EMPTY_I, _EMPTY_I
    src, dst = (_np(t).astype(np.int64) for t in edge_index)
    return src, dst


def _sorted_csc(src: np.ndarray, dst: np.ndarray, num_dst: int, where: Any) -> tuple[np.ndarray, ...]:
    """CSC arrays of edges already sorted by destination (PyG's ``is_sorted=True``): no sort, but the
    claim is checked (one pass), since a false one would silently give wrong neighbours."""
    bad = np.flatnonzero(dst[1:] < dst[:-1])
    if len(bad):
        i = int(bad[0])
        raise InvalidInputError(
            f"is_sorted=True but edge_index of {where!r} is not sorted by destination: edge {i + 1} goes to "
            f"node {int(dst[i + 1])} after edge {i} to node {int(dst[i])}; sort it (torch_geometric.utils."
            "sort_edge_index(edge_index, sort_by_row=False)) or drop is_sorted"
        )
    indptr = np.zeros(num_dst + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, src, np.arange(len(src), dtype=np.int64)


def from_pyg(data: Any, weight_attr: str | None, time_attr: str | None, is_sorted: bool = False,
             mask: Any = None) -> dict[Any, EdgeTopology]:
    """Topology of an in-memory PyG ``Data``/``HeteroData`` (one block per edge type); with ``is_sorted``
    the edges are taken in their given order (sorted by destination) instead of being sorted; ``mask``
    (:class:`sampling.graph.edgemask.MessageEdges`) puts its edge type's ``link_split`` attribute into the block."""
    from sampling.graph.edgemask import pyg_split

    is_hetero = is_hetero_pyg(data)
    stores = data.edge_stores if is_hetero else [data]
    types = [s._key for s in stores] if is_hetero else [None]
    out = {}
    for store in stores:
        etype = store._key if is_hetero else None
        s_type, d_type = (etype[0], etype[2]) if is_hetero else (None, None)
        num_src = data[s_type].num_nodes if is_hetero else data.num_nodes
        num_dst = data[d_type].num_nodes if is_hetero else data.num_nodes
        src, dst = _coo(store)
        indptr, indices, eid = (_sorted_csc(src, dst, num_dst, etype) if is_sorted
                                else _csc_from_coo(src, dst, num_src, num_dst))
        weight = _np(store[weight_attr])[eid].astype(np.float64) if weight_attr and weight_attr in store else _EMPTY_F
        time = (_np(store[time_attr])[eid].astype(np.int64)
                if time_attr and time_attr in store and store.is_edge_attr(time_attr) else _EMPTY_I)
        masked = mask is not None and mask.applies_to(etype, types)
        block = CSCBlock(0, num_dst, in_huge_pages(indptr), indices, eid, weight, time,
                         packed=in_huge_pages(_pack(indices, eid, num_src)),
                         split=pyg_split(store, mask, eid) if masked else _EMPTY_I8, allowed=mask.bits if masked else 0)
        out[etype] = EdgeTopology(etype, s_type, d_type, [block], num_src, num_dst)
    return out


def from_dataset(dataset: Any, parts: list[int], weight_attr: str | None, time_attr: str | None,
                 disjoint: bool = False, mask: Any = None) -> dict[Any, EdgeTopology]:
    """Topology of a graphstore dataset: one memory-mapped block per partition in ``parts`` (a partition read
    without mapping, ``Dataset.read_unmapped``: a block of empty arrays, its chunk files and its edge count).

    The arrays the sampler will read are prefaulted: the packed pairs when the dataset has them (every
    driver of the engine reads those), else the int64 ``indices``/``eid``; and edge times when temporal.
    ``mask`` (:class:`sampling.graph.edgemask.MessageEdges`) puts its edge type's link split into the blocks.
    """
    from sampling.graph.edgemask import dataset_split, reverse_split

    if mask is not None:
        mask.target(dataset.edge_types)  # raises for an unknown edge type
    digest = hashlib.sha256(json.dumps(dataset.manifest.to_json(), sort_keys=True).encode()).hexdigest()[:24]
    out = {}
    for info in dataset.manifest.edge_types:
        src = next(t for t in dataset.manifest.node_types if t.key == info.src)
        dst = next(t for t in dataset.manifest.node_types if t.key == info.dst)
        blocks = []
        for part in parts:
            _, gs = dataset.partition(part)
            files, edges = None, 0
            if part in getattr(dataset, "unmapped_parts", ()):  # read with pread: nothing of it is mapped
                indptr, indices, eid, packed, files, edges = _unmapped_block(dataset, part, info)
            else:
                indptr, indices, eid = gs.csc_arrays(info.name)
                packed = gs.packed_csc(info.name)
                for array in (indptr, packed) if packed is not None else (indptr, indices, eid):
                    prefault(array)
            if time_attr and time_attr in info.attrs:
                prefault(gs.edge_attr(time_attr, info.name).numpy())  # read at random by temporal sampling
            weight = (gs.edge_attr(weight_attr, info.name).numpy().astype(np.float64, copy=False)
                      if weight_attr and weight_attr in info.attrs else _EMPTY_F)
            time = (gs.edge_attr(time_attr, info.name).numpy().astype(np.int64, copy=False)
                    if time_attr and time_attr in info.attrs else _EMPTY_I)
            lo, hi = dst.offsets[part], dst.offsets[part + 1]
            split = _EMPTY_I8
            if mask is not None and mask.applies_to(info.name, dataset.edge_types):
                split = dataset_split(dataset, part, info.name, mask)
            elif mask is not None and mask.reverses(info.name, dataset.edge_types):
                split = reverse_split(dataset, part, info.name, mask)  # rev_writes: held out like writes
            origin = f"{dataset.url}|{digest}|{part}|{info.name}|w={weight_attr}|t={time_attr}"
            blocks.append(CSCBlock(lo, hi, indptr, indices, eid, weight, time, part,
                                   _EMPTY_I32 if packed is None else packed, split, mask.bits if len(split) else 0,
                                   origin, dataset.cache_config.directory, files, edges))
        out[info.name] = EdgeTopology(info.name, src.name, dst.name, blocks, src.num_nodes, dst.num_nodes)
    return out


def _unmapped_block(dataset: Any, part: int, info: Any) -> tuple[Any, ...]:
    """A partition read without mapping: ``(indptr, indices, eid, packed, files, edges)``, its arrays empty
    (the kernels read ``files``, the ``(indptr, packed)`` chunk files, instead) and ``edges`` its edge count.
    Its topology is checked (:meth:`~graphstore.dataset.opened.Dataset.check_topology`), as a mapped one's is;
    it needs the packed pairs."""
    from graphstore.dataset import layout

    dataset.check_topology(part, info.name)
    paths = {name: layout.edge_array(part, info.key, name) for name in (layout.INDPTR, layout.INDICES, layout.PACKED)}
    if paths[layout.PACKED] not in dataset.manifest.arrays:
        raise InvalidInputError(f"{dataset.url}: partition {part} of edge type {info.name!r} has no packed (source, "
                                "edge ID) pairs (node or edge IDs of 2**31 or more), which reading without mapping "
                                "needs; leave the dataset mapped")
    files = (dataset.chunk_files(paths[layout.INDPTR]), dataset.chunk_files(paths[layout.PACKED]))
    edges = int(dataset.manifest.arrays[paths[layout.INDICES]].shape[0])
    return _EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_I32, files, edges


def from_graph_store(graph_store: Any, weight_attr: str | None, time_attr: str | None, disjoint: bool = False,
                     mask: Any = None) -> dict[Any, EdgeTopology]:
    """Topology of a generic PyG ``GraphStore``, or of any store over graphstore partitions.

    A store saying which partitions it serves (``dataset_parts``: ``(dataset, [part, ...])``, as
    ``ZarrGraphStore`` and ``DatasetGraphStore`` do) is read memory-mapped per partition, with the
    input edge IDs; any other store through PyG's ``_edge_to_layout``.
    """
    served = getattr(graph_store, "dataset_parts", None)
    if served is not None:
        dataset, parts = served
        return from_dataset(dataset, list(parts), weight_attr, time_attr, disjoint, mask)
    if mask is not None:
        raise InvalidInputError("message_edges needs a graphstore dataset, its stores, or a PyG Data/HeteroData; "
                                f"{type(graph_store).__name__} has no link split the sampler can read")
    out = {}
    for attr in graph_store.get_all_edge_attrs():
        etype = attr.edge_type
        row, col, perm = graph_store._edge_to_layout(attr, "csc")
        indices, indptr = _np(row).astype(np.int64), _np(col).astype(np.int64)
        eid = _np(perm).astype(np.int64) if perm is not None else np.arange(len(indices), dtype=np.int64)
        num_src = attr.size[0] if attr.size else int(indices.max(initial=-1)) + 1
        s_type, d_type = (etype[0], etype[2]) if isinstance(etype, tuple) else (None, None)
        block = CSCBlock(0, len(indptr) - 1, in_huge_pages(indptr), indices, eid,
                         packed=in_huge_pages(_pack(indices, eid, num_src)))
        out[etype] = EdgeTopology(etype, s_type, d_type, [block], num_src, len(indptr) - 1)
    return out


def node_times(data: Any, time_attr: str | None) -> dict[Any, np.ndarray]:
    """Per node type, the ``time_attr`` of every node by global ID (int64): a temporal sampler's node times, from
    a dataset (every partition), one partition's store pair, another (FeatureStore, GraphStore) pair or a
    ``Data``/``HeteroData``."""
    if time_attr is None:
        return {}
    from graphstore.dataset.opened import Dataset

    if isinstance(data, Dataset):
        out = {}
        for info in data.manifest.node_types:
            if time_attr in info.attrs:
                parts = [data.partition(p)[0][info.name, time_attr, None].numpy() for p in range(data.num_parts)]
                out[info.name] = np.concatenate(parts).astype(np.int64)
        return out
    if isinstance(data, (tuple, list)) and hasattr(data[1], "dataset_parts"):
        # one partition's stores: the kernels index node times by global ID, sources of every partition
        return node_times(data[1].dataset_parts[0], time_attr)
    if isinstance(data, (tuple, list)):
        fs = data[0]
        return {a.group_name: fs[a.group_name, time_attr, None].numpy().astype(np.int64)
                for a in fs.get_all_tensor_attrs() if a.attr_name == time_attr}
    stores = data.node_stores
    return {getattr(s, "_key", None): s[time_attr].cpu().numpy().astype(np.int64)
            for s in stores if time_attr in s and s.is_node_attr(time_attr)}
