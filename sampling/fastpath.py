"""The one-call engine of ``NeighborSampler``: every hop of a homogeneous batch in one numba call, plain or
with its variants (weighted, temporal, disjoint, edge-masked: :mod:`sampling.variants`)."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import SamplerOutput

from graphstore.allocator import keep_freed_memory
from graphstore.errors import CorruptDatasetError, InvalidInputError, NotOwnedError
from sampling import multihop, variants
from sampling.topology import CSCBlock, EdgeTopology

_CUMULATIVE: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()  # id(weight) -> (weight, cumulative)
_CUMULATIVE_KEEP = 64
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Variants:
    """The per-edge decisions of a sampler (all off: the plain path). ``node_time`` (per node, global
    IDs) is the source nodes' times when ``temporal`` and the time is a node attribute."""

    weighted: bool = False
    temporal: bool = False
    last: bool = False
    disjoint: bool = False
    node_time: np.ndarray | None = None

    @property
    def plain(self) -> bool:
        return not (self.weighted or self.temporal or self.disjoint)


class FastPath:
    """Homogeneous sampling over local blocks: all hops in one numba call, over the packed layout when
    every block has it: :func:`sampling.multihop.sample_multihop` when plain (uniform, not disjoint, no
    mask), else :func:`sampling.variants.sample_variants` with the variants of ``variants`` and the
    blocks' link split mask (``CSCBlock.split``)."""

    def __init__(self, topo: EdgeTopology, num_nodes: int, fanouts: list[dict[Any, int]], replace: bool, *,
                 packed: bool = True, dense_max_nodes: int = multihop.DENSE_MAX_NODES,
                 variants: Variants = Variants()) -> None:
        keep_freed_memory()  # every batch allocates tens of MB of outputs
        blocks = topo.blocks
        self.num_nodes = num_nodes
        self.variants = variants
        self.extra = _variant_args(topo, variants)
        self.plain = self.extra is None
        # dense map: not disjoint, not too large (else the hash table: memory per thread ∝ batch, not graph)
        self.dense = num_nodes <= dense_max_nodes and not variants.disjoint
        self.lo, self.hi = int(topo.offsets[0]), int(topo.offsets[-1])
        self.covers_sources = self.lo == 0 and self.hi >= topo.num_src
        self.use_packed = packed and all(len(b.packed) == 2 * len(b.indices) for b in blocks)
        i64, i32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
        self.args = (tuple(b.indptr for b in blocks),
                     tuple(i64 if self.use_packed else b.indices for b in blocks),
                     tuple(i64 if self.use_packed else b.eid for b in blocks),
                     tuple(b.packed if self.use_packed else i32 for b in blocks),
                     self.use_packed, topo.offsets.astype(np.int64))
        self.unpacked = tuple(b.indices for b in blocks), tuple(b.eid for b in blocks)
        self.parts = np.array([b.part for b in blocks], np.int32)
        self.fanouts = np.array([hop[None] for hop in fanouts], np.int64)
        self.replace = replace

    def sample(self, seeds: np.ndarray, local: threading.local, seed_time: np.ndarray | None = None) -> SamplerOutput:
        """Sample one batch; ``seed_time`` (per seed) is the time limit of each subgraph when temporal."""
        if len(seeds) and (seeds.min() < self.lo or seeds.max() >= self.hi):
            bad = seeds[(seeds < self.lo) | (seeds >= self.hi)]
            raise NotOwnedError(f"seed nodes {bad[:5].tolist()} are outside [{self.lo}, {self.hi}), the node IDs "
                                "of this graph; pass IDs of existing nodes")
        if getattr(local, "dense", None) is None:  # per thread: the global->local map, reused by every batch
            local.seen = np.zeros(-(-self.num_nodes // 64) if self.dense else 0, np.uint64)
            local.dense = np.empty(self.num_nodes if self.dense else 0, np.int32)
            local.table = np.full(0 if self.dense else 1 << 12, -1, np.int64)
        try:
            if self.plain:
                result = multihop.sample_multihop(*self.args, seeds, self.fanouts, self.replace, local.rng, local.seen,
                                                  local.dense, local.table)
                batch = None
            else:
                *result, batch = self._sample_variants(seeds, local, seed_time)
            nodes, row, col, eid, pos, block_edges, per_hop_nodes, per_hop_edges, local.table = result
        except BaseException:  # e.g. MemoryError mid-batch: the map still holds this batch's nodes
            local.dense = None  # rebuilt empty by the next call
            raise
        if len(per_hop_nodes) and per_hop_nodes[0] < 0:
            raise CorruptDatasetError(f"a neighbor ID read from the topology is not a node ID (0..{self.num_nodes - 1});"
                                      " run `graphstore verify` on the dataset")
        start_len = multihop.buffer_len(len(seeds), self.fanouts)
        nodes, row, col, eid, pos = (_fit(a, start_len) for a in (nodes, row, col, eid, pos))
        batch = torch.from_numpy(_fit(batch, start_len)) if self.variants.disjoint else None
        out = SamplerOutput(torch.from_numpy(nodes), torch.from_numpy(row), torch.from_numpy(col),
                            torch.from_numpy(eid), batch, per_hop_nodes.tolist(), per_hop_edges.tolist())
        # called only if edge attributes are fetched; tensors (not arrays) so a worker hands them over
        # through shared memory rather than pickling their bytes
        out.edge_locator = {None: functools.partial(_locate, self.parts, torch.from_numpy(block_edges), len(eid),
                                                    torch.from_numpy(pos))}
        return out

    def _sample_variants(self, seeds: np.ndarray, local: threading.local, seed_time: np.ndarray | None) -> tuple:
        cumws, times, node_time, splits, allowed = self.extra
        if self.variants.temporal and (times is not None or node_time is not None):
            if seed_time is None or len(seed_time) != len(seeds):
                raise InvalidInputError(f"temporal sampling of {len(seeds)} seeds got seed times {seed_time!r}: pass "
                                        "one time per seed (input_time or edge_label_time)")
            limits = np.ascontiguousarray(seed_time, np.int64)
        else:
            times = node_time = limits = None  # neither edges nor nodes carry times: no constraint
        indptrs, indices, eids, packed, use_packed, offsets = self.args
        if use_packed:  # the filters read source IDs (node times) from the int64 arrays
            indices, eids = self.unpacked
        return variants.sample_variants(
            indptrs, indices, eids, packed, use_packed, offsets, seeds, self.fanouts, self.replace, local.rng,
            local.seen, local.dense, local.table, self.num_nodes, self.variants.disjoint, cumws, times, node_time,
            limits, self.variants.last, splits, allowed)


def _variant_args(topo: EdgeTopology, v: Variants) -> tuple | None:
    """``(cumulative weights, edge times, node times, splits, allowed)`` per block for
    :func:`sampling.variants.sample_variants` (``None`` each when off), or ``None`` for the plain path."""
    blocks = topo.blocks
    masked = any(len(b.split) for b in blocks)
    if v.plain and not masked:
        return None
    cumws = tuple(cumulative_weights(b) for b in blocks) if v.weighted else None
    times = tuple(b.time for b in blocks) if v.temporal and all(len(b.time) == len(b.indices) for b in blocks) else None
    node_time = v.node_time if v.temporal and v.node_time is not None else None
    splits = tuple(b.split for b in blocks) if masked else None
    return cumws, times, node_time, splits, blocks[0].allowed if masked else 0


def variants_ready(topo: EdgeTopology, v: Variants) -> bool:
    """Whether the variant kernel can take these blocks' attribute arrays (one array type per tuple)."""
    blocks = topo.blocks
    arrays = [b.weight for b in blocks] if v.weighted else []
    if v.weighted and not all(len(b.weight) == len(b.indices) for b in blocks):
        return False
    if v.temporal:
        arrays += [b.time for b in blocks if len(b.time)]
    if any(len(b.split) for b in blocks):
        if not all(len(b.split) == len(b.indices) and b.allowed == blocks[0].allowed for b in blocks):
            return False
        arrays += [b.split for b in blocks]
    return all(a.flags.writeable and a.flags.c_contiguous for a in arrays) and (
        not v.temporal or all(b.time.dtype == np.int64 for b in blocks)) and (
        v.node_time is None or (v.node_time.flags.writeable and v.node_time.dtype == np.int64))


def cumulative_weights(block: CSCBlock) -> np.ndarray:
    """The block's per-destination cumulative edge weights (float64), built once per process and block
    (kept for the last 64 weight arrays seen)."""
    key = id(block.weight)
    with _LOCK:
        hit = _CUMULATIVE.get(key)
        if hit is not None and hit[0] is block.weight:
            _CUMULATIVE.move_to_end(key)
            return hit[1]
    cum = variants.cumulative_weights(block.indptr, np.ascontiguousarray(block.weight, np.float64))
    with _LOCK:
        _CUMULATIVE[key] = (block.weight, cum)  # holding the weights keeps the id from being reused
        while len(_CUMULATIVE) > _CUMULATIVE_KEEP:
            _CUMULATIVE.popitem(last=False)
    return cum


def _fit(a: np.ndarray, buffer_len: int) -> np.ndarray:
    """``a``, a view into a kernel buffer sized for the worst case; copied out when it fills under half
    of it, so a batch kept alive (prefetched, queued) does not keep the whole buffer alive."""
    return a.copy() if 2 * len(a) < buffer_len else a


def _locate(parts: np.ndarray, block_edges: torch.Tensor, num_edges: int, pos: torch.Tensor
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(partition, CSC position)`` of every sampled edge, from each hop's per-block edge ranges."""
    bounds = np.append(block_edges.numpy()[:, :-1].ravel(), num_edges)
    return np.repeat(np.tile(parts, len(block_edges)), np.diff(bounds)), pos.numpy()


def kernel_ready(block: CSCBlock) -> bool:
    """The kernel takes tuples of one array type: contiguous, writable (copy-on-write maps are), int64."""
    arrays = (block.indptr, block.indices, block.eid, block.packed)
    return all(a.flags.writeable and a.flags.c_contiguous for a in arrays) and all(
        a.dtype == np.int64 for a in arrays[:3]) and block.packed.dtype == np.int32
