"""The fast path of ``NeighborSampler``: homogeneous uniform sampling in one numba call per batch."""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import SamplerOutput

from graphstore.allocator import keep_freed_memory
from graphstore.errors import CorruptDatasetError, NotOwnedError
from sampling import multihop
from sampling.topology import CSCBlock, EdgeTopology


class FastPath:
    """Homogeneous, uniform, non-disjoint sampling over local blocks: all hops in one numba call
    (:func:`sampling.multihop.sample_multihop`), over the packed layout when every block has it."""

    def __init__(self, topo: EdgeTopology, num_nodes: int, fanouts: list[dict[Any, int]], replace: bool, *,
                 packed: bool = True, dense_max_nodes: int = multihop.DENSE_MAX_NODES) -> None:
        keep_freed_memory()  # every batch allocates tens of MB of outputs
        blocks = topo.blocks
        self.num_nodes = num_nodes
        self.dense = num_nodes <= dense_max_nodes  # else the hash table (memory per thread ∝ batch, not graph)
        self.lo, self.hi = int(topo.offsets[0]), int(topo.offsets[-1])
        self.covers_sources = self.lo == 0 and self.hi >= topo.num_src
        self.use_packed = packed and all(len(b.packed) == 2 * len(b.indices) for b in blocks)
        i64, i32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
        self.args = (tuple(b.indptr for b in blocks),
                     tuple(i64 if self.use_packed else b.indices for b in blocks),
                     tuple(i64 if self.use_packed else b.eid for b in blocks),
                     tuple(b.packed if self.use_packed else i32 for b in blocks),
                     self.use_packed, topo.offsets.astype(np.int64))
        self.parts = np.array([b.part for b in blocks], np.int32)
        self.fanouts = np.array([hop[None] for hop in fanouts], np.int64)
        self.replace = replace

    def sample(self, seeds: np.ndarray, local: threading.local) -> SamplerOutput:
        if len(seeds) and (seeds.min() < self.lo or seeds.max() >= self.hi):
            bad = seeds[(seeds < self.lo) | (seeds >= self.hi)]
            raise NotOwnedError(f"seed nodes {bad[:5].tolist()} are outside [{self.lo}, {self.hi}), the node IDs "
                                "of this graph; pass IDs of existing nodes")
        if getattr(local, "dense", None) is None:  # per thread: the global->local map, reused by every batch
            local.seen = np.zeros(-(-self.num_nodes // 64) if self.dense else 0, np.uint64)
            local.dense = np.empty(self.num_nodes if self.dense else 0, np.int32)
            local.table = np.full(0 if self.dense else 1 << 12, -1, np.int64)
        try:
            nodes, row, col, eid, pos, block_edges, per_hop_nodes, per_hop_edges, local.table = multihop.sample_multihop(
                *self.args, seeds, self.fanouts, self.replace, local.rng, local.seen, local.dense, local.table)
        except BaseException:  # e.g. MemoryError mid-batch: the map still holds this batch's nodes
            local.dense = None  # rebuilt empty by the next call
            raise
        if len(per_hop_nodes) and per_hop_nodes[0] < 0:
            raise CorruptDatasetError(f"a neighbor ID read from the topology is not a node ID (0..{self.num_nodes - 1});"
                                      " run `graphstore verify` on the dataset")
        start_len = multihop.buffer_len(len(seeds), self.fanouts)
        nodes, row, col, eid, pos = (_fit(a, start_len) for a in (nodes, row, col, eid, pos))
        out = SamplerOutput(torch.from_numpy(nodes), torch.from_numpy(row), torch.from_numpy(col),
                            torch.from_numpy(eid), None, per_hop_nodes.tolist(), per_hop_edges.tolist())
        # called only if edge attributes are fetched; tensors (not arrays) so a worker hands them over
        # through shared memory rather than pickling their bytes
        out.edge_locator = {None: functools.partial(_locate, self.parts, torch.from_numpy(block_edges), len(eid),
                                                    torch.from_numpy(pos))}
        return out


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
