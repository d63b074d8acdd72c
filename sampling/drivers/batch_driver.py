"""The one-call driver of ``NeighborSampler``: every hop of a homogeneous batch over local blocks in one
numba call of the sampling kernel (:func:`sampling.kernels.hop_kernel.sample_variants`), plain or with variants."""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import SamplerOutput

from graphstore.heap import keep_freed_memory
from graphstore.errors import CorruptDatasetError, InvalidInputError, NotOwnedError
from sampling.kernels import hop_kernel
from sampling.graph.kernel_args import BlockArgs, Variants
from sampling.kernels.idmap import DENSE_MAX_NODES
from sampling.kernels.structs import IdMap
from sampling.graph.topology import EdgeTopology

__all__ = ["FastPath", "Variants"]


class FastPath:
    """Homogeneous sampling over local blocks: all hops in one numba call of
    :func:`sampling.kernels.hop_kernel.sample_variants`, over the packed layout when every block has it, with the
    variants of ``variants`` (none: ``plain``), the blocks' link split mask (``CSCBlock.split``) and a
    link batch's exclusion."""

    def __init__(self, topo: EdgeTopology, num_nodes: int, fanouts: list[dict[Any, int]], replace: bool, *,
                 packed: bool = True, dense_max_nodes: int = DENSE_MAX_NODES,
                 variants: Variants = Variants(), positions: bool = True) -> None:
        keep_freed_memory()  # every batch allocates tens of MB of outputs
        self.num_nodes = num_nodes
        self.variants = variants
        self.blocks = BlockArgs(topo.blocks, variants, variants.node_time, packed)
        self.plain = self.blocks.plain
        # dense map: not disjoint, not too large (else the hash table: memory per thread ∝ batch, not graph)
        self.dense = num_nodes <= dense_max_nodes and not variants.disjoint
        self.lo, self.hi = int(topo.offsets[0]), int(topo.offsets[-1])
        self.covers_sources = self.lo == 0 and self.hi >= topo.num_src
        self.use_packed = self.blocks.use_packed
        self.parts = self.blocks.parts
        self.fanouts = np.array([hop[None] for hop in fanouts], np.int64)
        self.replace = replace
        self.positions = positions  # whether edge_locator is wanted (edge attributes read by CSC position)

    def sample(self, seeds: np.ndarray, local: threading.local, seed_time: np.ndarray | None = None,
               exclusion: tuple | None = None, strict: bool = False) -> SamplerOutput:
        """Sample one batch; ``seed_time`` (per seed) is the time limit of each subgraph when temporal;
        ``exclusion`` (sorted keys, multiplier, mode) the links to drop; ``strict``: strictly earlier."""
        if len(seeds) and (seeds.min() < self.lo or seeds.max() >= self.hi):
            bad = seeds[(seeds < self.lo) | (seeds >= self.hi)]
            raise NotOwnedError(f"seed nodes {bad[:5].tolist()} are outside [{self.lo}, {self.hi}), the node IDs "
                                "of this graph; pass IDs of existing nodes")
        if getattr(local, "dense", None) is None:  # per thread: the global->local map, reused by every batch
            local.seen = np.zeros(-(-self.num_nodes // 64) if self.dense else 0, np.uint64)
            local.dense = np.empty(self.num_nodes if self.dense else 0, np.int32)
            local.table = np.full(0 if self.dense else 1 << 12, -1, np.int64)
            local.sizes = np.zeros(4, np.int64)  # the kernel's buffer sizes: what the last batch needed
        try:
            time_sorted, *result, batch = self._sample(seeds, local, seed_time, exclusion, strict)
            nodes, row, col, eid, pos, block_edges, per_hop_nodes, per_hop_edges, local.table = result
        except BaseException:  # e.g. MemoryError mid-batch: the map still holds this batch's nodes
            local.dense = None  # rebuilt empty by the next call
            raise
        if len(per_hop_nodes) and per_hop_nodes[0] < 0:
            raise CorruptDatasetError(f"a neighbor ID read from the topology is not a node ID (0..{self.num_nodes - 1});"
                                      " run `graphstore verify` on the dataset")
        sizes = local.sizes
        edge_room, node_room = int(sizes[0]), int(sizes[1])
        row, col, eid = (fit_buffer(a, edge_room) for a in (row, col, eid))
        if self.positions or not time_sorted:  # else the batch never reads them (see edge_locator below)
            pos = fit_buffer(pos, edge_room)
        nodes = fit_buffer(nodes, node_room)
        batch = torch.from_numpy(fit_buffer(batch, node_room)) if self.variants.disjoint else None
        sizes[0], sizes[1] = (n + n // 4 for n in sizes[2:])  # the next batch's: this one's need, and a margin
        out = SamplerOutput(torch.from_numpy(nodes), torch.from_numpy(row), torch.from_numpy(col),
                            torch.from_numpy(eid), batch, per_hop_nodes.tolist(), per_hop_edges.tolist())
        if time_sorted and not self.positions:
            return out  # picks in time order: positions translated only when edge attributes want them
        # called only if edge attributes are fetched; tensors (not arrays) so a worker hands them over
        # through shared memory rather than pickling their bytes. Picks in time order become CSC positions
        # then too: the translation reads one random entry per edge (a quarter of a temporal batch's time)
        located = _TimeSorted(self.blocks, pos, block_edges) if time_sorted else torch.from_numpy(pos)
        out.edge_locator = {None: functools.partial(_locate, self.parts, torch.from_numpy(block_edges), len(eid),
                                                    located)}
        return out

    def _sample(self, seeds: np.ndarray, local: threading.local, seed_time: np.ndarray | None,
                exclusion: tuple | None, strict: bool) -> tuple:
        limits = None
        if self.variants.temporal and self.blocks.timed:
            if seed_time is None or len(seed_time) != len(seeds):
                raise InvalidInputError(f"temporal sampling of {len(seeds)} seeds got seed times {seed_time!r}: pass "
                                        "one time per seed (input_time or edge_label_time)")
            limits = np.ascontiguousarray(seed_time, np.int64) - (1 if strict else 0)  # t' < t <=> t' <= t - 1
        var = self.blocks.var(self.variants.last, limits is not None, exclusion)
        result = hop_kernel.sample_variants(self.blocks.topo, seeds, self.fanouts, self.replace, local.rng,
                                            IdMap(local.seen, local.dense, local.table), self.num_nodes,
                                            self.variants.disjoint, var, limits, local.sizes)
        return BlockArgs.time_sorted(var), *result  # first: whether the picks are positions in time order


def fit_buffer(a: np.ndarray, buffer_len: int) -> np.ndarray:
    """``a``, a view into a kernel buffer of ``buffer_len`` entries; copied out when it fills under half of
    it, so a batch kept alive (prefetched, queued) does not keep the whole buffer alive. The buffers are
    sized by what the thread's last batch needed (``sizes`` of
    :func:`~sampling.kernels.hop_kernel.sample_variants`), so most batches fill them past half and are
    handed over as they are (a copy was a tenth of a batch's time when they were sized for the worst case)."""
    return a.copy() if 2 * len(a) < buffer_len else a


def _locate(parts: np.ndarray, block_edges: torch.Tensor, num_edges: int, pos: torch.Tensor | _TimeSorted
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(partition, CSC position)`` of every sampled edge, from each hop's per-block edge ranges."""
    bounds = np.append(block_edges.numpy()[:, :-1].ravel(), num_edges)
    positions = pos.positions() if isinstance(pos, _TimeSorted) else pos
    return np.repeat(np.tile(parts, len(block_edges)), np.diff(bounds)), positions.numpy()


class _TimeSorted:
    """A batch's picks as positions in time order, translated to CSC positions once, when first asked
    (:meth:`BlockArgs.csc_positions`), or before the batch is pickled to another process (a loader
    worker's batch): the translation needs the blocks' order arrays, which stay in this process."""

    def __init__(self, blocks: BlockArgs, pos: np.ndarray, block_edges: np.ndarray) -> None:
        self._blocks: BlockArgs | None = blocks
        self._pos, self._block_edges = pos, block_edges
        self._lock = threading.Lock()

    def positions(self) -> torch.Tensor:
        with self._lock:
            if self._blocks is not None:
                self._blocks.csc_positions(self._pos, self._block_edges)
                self._blocks = None
        return torch.from_numpy(self._pos)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _identity, (self.positions(),)


def _identity(value: Any) -> Any:
    return value
