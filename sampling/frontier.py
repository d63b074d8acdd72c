"""The state of one sampled batch: per node type a de-duplicating ID table, and the hop-by-hop frontier."""

from __future__ import annotations

import functools
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from sampling import kernels

_EMPTY_I = np.zeros(0, np.int64)


class HopSource(Protocol):
    """What a :class:`Frontier` reads from the sampler driving it (``NeighborSampler`` is one)."""

    config: Any
    disjoint: bool
    edge_types: list[Any]
    topology: dict[Any, Any]
    node_time: dict[Any, np.ndarray]

    def node_tables(self) -> dict[Any, NodeTable]: ...


class NodeTable:
    """Sampled nodes of one type: global IDs in local order, their subgraph (batch) and a hash map.

    Keys are global IDs, or ``batch * num_nodes + id`` for disjoint subgraphs.
    """

    def __init__(self, num_nodes: int, disjoint: bool, capacity: int = 1 << 12) -> None:
        self.num_nodes, self.disjoint = num_nodes, disjoint
        self.keys = np.full(capacity, -1, np.int64)
        self.vals = np.empty(capacity, np.int64)
        self.ids: list[np.ndarray] = []
        self.batches: list[np.ndarray] = []
        self.count = 0

    def _room(self, extra: int) -> None:
        need = 2 * (self.count + extra)
        if need > len(self.keys):
            capacity = 1 << max(need - 1, 1).bit_length()
            self.keys, self.vals = kernels.hash_rehash(self.keys, self.vals, capacity)

    def add(self, ids: np.ndarray, batch: np.ndarray | None, force_new: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
        """Local IDs of ``ids`` (new ones appended); returns ``(local, is_new)``.

        ``batch`` (the subgraph of each entry) is needed only for disjoint tables. ``force_new``
        appends every entry (seeds keep their positions even when repeated).
        """
        self._room(len(ids))
        keys = batch * self.num_nodes + ids if self.disjoint else ids
        local, new, next_id = kernels.hash_insert(self.keys, self.vals, keys, self.count)
        if force_new:  # every entry gets its own position; a repeated key maps to its first one
            local = np.arange(self.count, self.count + len(ids), dtype=np.int64)
            new = np.ones(len(ids), bool)
            if next_id - self.count != len(ids):
                uniq, first = np.unique(keys, return_index=True)
                kernels.hash_set(self.keys, self.vals, uniq, first + self.count)
            next_id = self.count + len(ids)
        self.count = next_id
        self.ids.append(ids if force_new else ids[new])
        if self.disjoint:
            self.batches.append(batch[new])
        return local, new

    def reset(self) -> None:
        """Empty the table for the next batch, keeping its capacity (O(nodes sampled), not O(capacity))."""
        if self.count:
            ids, batch = self.node_ids(), self.batch()
            kernels.hash_clear(self.keys, batch * self.num_nodes + ids if self.disjoint else ids)
        self.ids, self.batches, self.count = [], [], 0

    def node_ids(self) -> np.ndarray:
        return np.concatenate(self.ids) if self.ids else _EMPTY_I

    def batch(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else _EMPTY_I


class Frontier:
    """Runs the hops of one batch; ``output`` turns the result into PyG's sampler output."""

    def __init__(self, sampler: HopSource, seeds: dict[Any, Any], times: dict[Any, Any] | None,
                 excluded: dict[Any, tuple] | None = None, strict: bool = False) -> None:
        """``excluded``: per edge type, links the kernels drop (see ``sampling.edgemask.exclusion``);
        ``strict``: neighbours must be strictly earlier than the seed time (not equal)."""
        self.sampler = sampler
        self.excluded = excluded or {}
        self.tables = sampler.node_tables()
        self.current: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.seed_time: dict[Any, np.ndarray] = {}
        self.edges = {et: ([], [], [], [], []) for et in sampler.edge_types}  # row, col, eid, part, pos
        self.nodes_per_hop = {t: [0] for t in self.tables}
        self.edges_per_hop: dict[Any, list[int]] = {et: [] for et in sampler.edge_types}
        offset = 0
        for ntype, ids in seeds.items():
            ids = _numpy(ids)
            batch = np.arange(offset, offset + len(ids), dtype=np.int64)
            offset += len(ids)
            local, _ = self.tables[ntype].add(ids, batch, force_new=True)
            time = _numpy(times[ntype]) if times and ntype in times else _EMPTY_I
            time = time - 1 if strict and len(time) else time  # times are int64: t' <= t - 1 <=> t' < t
            self.seed_time[ntype] = time
            self.current[ntype] = (ids, local, batch, time)
            self.nodes_per_hop[ntype][0] = len(ids)
        self.all_times = np.concatenate([self.seed_time[t] for t in seeds]) if times else _EMPTY_I

    def hop(self, fanouts: dict[Any, int]) -> None:
        """Sample one hop for every edge type from the current frontier of its destination type."""
        found: dict[Any, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {t: [] for t in self.tables}
        for etype, fanout in fanouts.items():
            topo = self.sampler.topology[etype]
            front = self.current.get(topo.dst_type)
            if front is None or len(front[0]) == 0 or fanout == 0:
                self.edges_per_hop[etype].append(0)
                continue
            ids, local, batch, time = front
            order, counts, nbrs, eids, parts, pos = self._sample(topo, ids, fanout, time)
            nbr_batch = np.repeat(batch[order], counts) if self.sampler.disjoint else _EMPTY_I
            src_local, new = self.tables[topo.src_type].add(nbrs, nbr_batch)
            row, col, eid, part, position = self.edges[etype]
            row.append(src_local)
            col.append(np.repeat(local[order], counts))
            eid.append(eids)
            part.append(parts)
            position.append(pos)
            self.edges_per_hop[etype].append(len(nbrs))
            found[topo.src_type].append((nbrs[new], src_local[new], nbr_batch[new] if len(nbr_batch) else _EMPTY_I))
        self.current = {}
        for ntype, pieces in found.items():
            ids = np.concatenate([p[0] for p in pieces]) if pieces else _EMPTY_I
            local = np.concatenate([p[1] for p in pieces]) if pieces else _EMPTY_I
            batch = np.concatenate([p[2] for p in pieces]) if pieces else _EMPTY_I
            time = self.all_times[batch] if len(self.all_times) else _EMPTY_I
            self.current[ntype] = (ids, local, batch, time)
            self.nodes_per_hop[ntype].append(len(ids))

    def _sample(self, topo: Any, ids: np.ndarray, fanout: int, time: np.ndarray) -> tuple[np.ndarray, ...]:
        """Sample in every block that owns some of ``ids``; results grouped by block."""
        cfg = self.sampler.config
        node_time = self.sampler.node_time.get(topo.src_type, _EMPTY_I)
        if not len(node_time) and not topo.has_time:
            time = _EMPTY_I  # neither its edges nor its source nodes have times: no constraint here
        strategy = kernels.STRATEGY_LAST if cfg.temporal_strategy == "last" else kernels.STRATEGY_UNIFORM
        if len(topo.blocks) == 1:
            if ids.min() < topo.blocks[0].lo or ids.max() >= topo.blocks[0].hi:
                topo.block_of(ids)  # raises the not-owned error
            groups = [(0, np.arange(len(ids)))]
        else:
            which = topo.block_of(ids)
            order = np.argsort(which, kind="stable")
            bounds = np.searchsorted(which[order], np.arange(len(topo.blocks) + 1))
            groups = [(b, order[bounds[b]: bounds[b + 1]]) for b in range(len(topo.blocks)) if bounds[b + 1] > bounds[b]]
        # remote blocks first, so their requests are in flight while local blocks are sampled
        groups.sort(key=lambda g: not getattr(topo.blocks[g[0]], "is_remote", False))
        pending = []
        for b, sel in groups:
            block = topo.blocks[b]
            excluded = [self.excluded[topo.edge_type]] if topo.edge_type in self.excluded else []
            result = block.start(ids[sel], fanout, cfg.replace, node_time, time[sel] if len(time) else _EMPTY_I,
                                 strategy, *excluded)
            pending.append((sel, block.part, result))
        outputs = []
        for sel, part, result in pending:
            counts, nbrs, eids, pos = result()
            outputs.append((sel, counts, nbrs, eids, np.full(len(pos), part, np.int32), pos))
        if len(outputs) == 1:
            return outputs[0]
        return tuple(np.concatenate(col) for col in zip(*outputs))

    def output(self, hetero: bool) -> SamplerOutput | HeteroSamplerOutput:
        node = {t: torch.from_numpy(tab.node_ids()) for t, tab in self.tables.items()}
        edges = {et: tuple(_cat(c) for c in cols) for et, cols in self.edges.items()}
        batch = {t: torch.from_numpy(tab.batch()) for t, tab in self.tables.items()} if self.sampler.disjoint else None
        if not hetero:
            row, col, eid, part, pos = edges[None]
            out = SamplerOutput(node[None], _t(row), _t(col), _t(eid), batch[None] if batch else None,
                                self.nodes_per_hop[None], self.edges_per_hop[None])
            # called on demand; tensors cross from a worker through shared memory
            out.edge_locator = {None: functools.partial(_pair, torch.from_numpy(part), torch.from_numpy(pos))}
            return out
        out = HeteroSamplerOutput(
            node=node, row={et: _t(e[0]) for et, e in edges.items()}, col={et: _t(e[1]) for et, e in edges.items()},
            edge={et: _t(e[2]) for et, e in edges.items()}, batch=batch, num_sampled_nodes=self.nodes_per_hop,
            num_sampled_edges=self.edges_per_hop)
        out.edge_locator = {et: functools.partial(_pair, torch.from_numpy(e[3]), torch.from_numpy(e[4]))
                            for et, e in edges.items()}
        return out


def _pair(part: torch.Tensor, pos: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return part.numpy(), pos.numpy()


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(value, dtype=np.int64)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _EMPTY_I


def _t(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
