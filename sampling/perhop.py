"""The per-hop driver of the sampling engine: heterogeneous graphs, the distributed sampler, stores
holding some partitions. Per hop, one kernel call per edge type (per run of local blocks); the
frontier nodes owned by remote blocks go to their owners first, one request per block per edge type
per hop, answered by the same kernel (``PartitionServer.sample``), while the local part runs here."""

from __future__ import annotations

import functools
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from graphstore.errors import CorruptDatasetError
from sampling import variants
from sampling.engine import BlockArgs, Variants
from sampling.idmap import DENSE_MAX_NODES
from sampling.picks import STRATEGY_LAST, STRATEGY_UNIFORM

_EMPTY_I = np.zeros(0, np.int64)
_EMPTY_F = np.zeros(0, np.float64)


class HopSource(Protocol):
    """What the driver reads from the sampler driving it (``NeighborSampler`` is one)."""

    config: Any
    disjoint: bool
    edge_types: list[Any]
    topology: dict[Any, Any]
    node_time: dict[Any, np.ndarray]

    def engine_runs(self, etype: Any) -> list[tuple[Any, Any]]: ...


def engine_runs(topo: Any, variants_of: Variants, packed: bool = True) -> list[tuple[Any, Any]]:
    """The blocks of an edge type as the driver visits them: ``(BlockArgs, block indices)`` per run of
    consecutive local blocks, ``(remote block, [index])`` per remote one."""
    runs: list[tuple[Any, Any]] = []
    local: list[int] = []
    for b, block in enumerate(topo.blocks):
        if getattr(block, "is_remote", False):
            if local:
                runs.append((BlockArgs([topo.blocks[i] for i in local], variants_of, variants_of.node_time, packed),
                             local))
                local = []
            runs.append((block, [b]))
        else:
            local.append(b)
    if local:
        runs.append((BlockArgs([topo.blocks[i] for i in local], variants_of, variants_of.node_time, packed), local))
    return runs


class _Nodes:
    """The sampled nodes of one type in a batch: global IDs in local order, subgraphs, the map."""

    def __init__(self, num_nodes: int, disjoint: bool, maps: list) -> None:
        self.num_nodes, self.disjoint, self.maps = num_nodes, disjoint, maps  # maps: [seen, dense, table]
        self.nodes, self.batch_of, self.count = _EMPTY_I, _EMPTY_I, 0
        self.front = (0, 0)
        self.per_hop = [0]

    def seed(self, ids: np.ndarray, first: int) -> None:
        self.nodes = np.empty(max(len(ids), 16), np.int64)
        self.batch_of = np.empty(len(self.nodes) if self.disjoint else 0, np.int64)
        seen, dense, table = self.maps
        self.maps[2] = variants.seed_map(seen, dense, table, ids, self.nodes, self.batch_of, self.num_nodes,
                                         self.disjoint, first)
        self.count = len(ids)
        self.front, self.per_hop = (0, len(ids)), [len(ids)]

    def relabel(self, row: np.ndarray, col: np.ndarray, col_batch: np.ndarray) -> None:
        seen, dense, table = self.maps
        n, valid, self.nodes, self.batch_of, self.maps[2] = variants.relabel_hop(
            seen, dense, table, row, col, col_batch, self.nodes, self.batch_of, self.count, self.num_nodes,
            self.disjoint)
        self.count = n
        if not valid:
            raise CorruptDatasetError(f"a neighbor ID read from the topology is not a node ID "
                                      f"(0..{self.num_nodes - 1}); run `graphstore verify` on the dataset")

    def end_hop(self) -> None:
        self.front = (self.front[1], self.count)
        self.per_hop.append(self.count - self.front[0])

    def forget(self) -> None:
        seen, _, table = self.maps
        variants.forget_map(seen, table, self.nodes, self.batch_of, self.count, self.num_nodes, self.disjoint)


def node_maps(local: Any, counts: dict[Any, int], disjoint: bool) -> dict[Any, list]:
    """Per node type this thread's de-duplication map ``[seen, dense, table]`` (reused by every batch)."""
    maps = getattr(local, "hop_maps", None)
    if maps is None:
        maps = local.hop_maps = {}
        for t, n in counts.items():
            dense = n <= DENSE_MAX_NODES and not disjoint
            maps[t] = [np.zeros(-(-n // 64) if dense else 0, np.uint64), np.empty(n if dense else 0, np.int32),
                       np.full(0 if dense else 1 << 12, -1, np.int64)]
    return maps


def sample(sampler: HopSource, local: Any, seeds: dict[Any, Any], times: dict[Any, Any] | None,
           excluded: dict[Any, tuple], strict: bool, hetero: bool) -> SamplerOutput | HeteroSamplerOutput:
    """One batch, hop by hop (``excluded``: per edge type the links to drop; ``strict``: neighbours
    strictly earlier than their seed time)."""
    counts = sampler.num_nodes if isinstance(sampler.num_nodes, dict) else {None: sampler.num_nodes}
    maps = node_maps(local, counts, sampler.disjoint)
    types = {t: _Nodes(n, sampler.disjoint, maps[t]) for t, n in counts.items()}
    try:
        seed_times = _seed(types, seeds, times, strict)
        edges = {et: [] for et in sampler.edge_types}
        per_hop: dict[Any, list[int]] = {et: [] for et in sampler.edge_types}
        for fanouts in sampler._fanouts:
            for etype, k in fanouts.items():
                per_hop[etype].append(_hop(sampler, local, types, etype, k, seed_times, excluded.get(etype),
                                           edges[etype]))
            for nodes in types.values():
                nodes.end_hop()
    except BaseException:
        local.hop_maps = None  # a batch stopped midway leaves entries behind: new maps next time
        raise
    for nodes in types.values():
        nodes.forget()
    return _output(types, edges, per_hop, sampler.disjoint, hetero)


def _seed(types: dict[Any, _Nodes], seeds: dict[Any, Any], times: dict[Any, Any] | None, strict: bool
          ) -> np.ndarray | None:
    offset, all_times = 0, []
    for ntype, ids in seeds.items():
        ids = _numpy(ids)
        types[ntype].seed(ids, offset)
        offset += len(ids)
        if times:
            time = _numpy(times[ntype]) if ntype in times else _EMPTY_I
            all_times.append(time - 1 if strict else time)  # int64 times: t' < t <=> t' <= t - 1
    return np.ascontiguousarray(np.concatenate(all_times), np.int64) if times else None


def _hop(sampler: HopSource, local: Any, types: dict[Any, _Nodes], etype: Any, k: int, seed_times: Any,
         exclusion: tuple | None, edges: list) -> int:
    """Sample edge type ``etype`` from its destination type's frontier; returns the edges sampled."""
    topo = sampler.topology[etype]
    dst, src = types[topo.dst_type], types[topo.src_type]
    lo, hi = dst.front
    if hi == lo or k == 0:
        return 0
    ids = dst.nodes[lo:hi]
    limits = None
    if seed_times is not None and (topo.has_time or topo.src_type in sampler.node_time):
        limits = seed_times[dst.batch_of[lo:hi]]
    row, col, eid, part, pos = _edge_type(sampler, local, etype, topo, ids, k, limits, exclusion)
    col += lo
    src.relabel(row, col, dst.batch_of)
    edges.append((row, col, eid, part, pos))
    return len(row)


def _edge_type(sampler: HopSource, local: Any, etype: Any, topo: Any, ids: np.ndarray, k: int, limits: Any,
               exclusion: tuple | None) -> tuple[np.ndarray, ...]:
    """``(sources, frontier positions, edge IDs, partitions, CSC positions)`` of ``ids``' picks: the
    remote blocks' nodes requested first, then the local runs sampled here, then the answers read."""
    runs = sampler.engine_runs(etype)
    which = topo.block_of(ids)  # raises for nodes no block owns
    c = sampler.config
    strategy = STRATEGY_LAST if c.temporal_strategy == "last" else STRATEGY_UNIFORM
    pending = []
    for block, (b,) in ((r, i) for r, i in runs if getattr(r, "is_remote", False)):
        sel = np.flatnonzero(which == b)
        if len(sel):
            sel = sel[np.argsort(ids[sel], kind="stable")]  # the owner reads its CSC in one forward sweep
            sent = limits[sel] if limits is not None else _EMPTY_I
            seed = int(variants.draw_seed(local.rng))
            pending.append((sel, block.part, block.start(ids[sel], k, c.replace, sent, strategy, exclusion, seed)))
    pieces = []
    for args, members in ((r, i) for r, i in runs if not getattr(r, "is_remote", False)):
        sel = np.flatnonzero((which >= members[0]) & (which <= members[-1])) if len(runs) > 1 else None
        pieces.append(_local(args, local, ids if sel is None else ids[sel], sel, k, c.replace, c.temporal_strategy,
                             limits, exclusion))
    for sel, part, result in pending:
        counts, nbrs, eids, pos = result()
        pieces.append((nbrs, np.repeat(sel, counts), eids, np.full(len(nbrs), part, np.int32), pos))
    if len(pieces) == 1:
        return pieces[0]
    return tuple(np.concatenate(col) for col in zip(*pieces))


def _local(args: BlockArgs, local: Any, ids: np.ndarray, sel: np.ndarray | None, k: int, replace: bool,
           strategy: str, limits: Any, exclusion: tuple | None) -> tuple[np.ndarray, ...]:
    if sel is not None and limits is not None:
        limits = limits[sel]
    row, col, eid, pos, block_edges = run_kernel(args, local.rng, ids, k, replace, strategy == "last", limits,
                                                 exclusion, in_order=False)
    part = np.repeat(args.parts, np.diff(block_edges))
    return row, (col if sel is None else sel[col]), eid, part, pos


def run_kernel(args: BlockArgs, rng: np.ndarray, ids: np.ndarray, k: int, replace: bool, last: bool, limits: Any,
               exclusion: tuple | None, in_order: bool) -> tuple[np.ndarray, ...]:
    """One hop of ``ids`` (owned by ``args``' blocks): ``(sources, positions in ids, edge IDs, CSC
    positions, each block's first edge)``."""
    ids = np.ascontiguousarray(ids, np.int64)
    if limits is not None and args.timed:
        limits = np.ascontiguousarray(limits, np.int64)
    else:
        limits = None
    var = args.var(last, limits is not None, exclusion)
    block_edges = np.zeros(len(args.offsets), np.int64)
    bufs = (_EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_F)
    out = (_EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_I)
    e, (row, col, eid, pos), _ = variants.hop_picks(args.topo, ids, 0, len(ids), int(k), bool(replace), rng,
                                                    in_order, out, 0, block_edges, bufs, var, limits)
    pos = pos[:e]
    if var[6] is not None:  # picks in time order: their CSC positions
        args.csc_positions(pos, block_edges)
    return row[:e], col[:e], eid[:e], pos, block_edges


def _output(types: dict[Any, _Nodes], edges: dict[Any, list], per_hop: dict[Any, list[int]], disjoint: bool,
            hetero: bool) -> SamplerOutput | HeteroSamplerOutput:
    node = {t: torch.from_numpy(n.nodes[: n.count].copy()) for t, n in types.items()}
    batch = {t: torch.from_numpy(n.batch_of[: n.count].copy()) for t, n in types.items()} if disjoint else None
    cols = {et: tuple(_cat([p[i] for p in pieces], np.int32 if i == 3 else np.int64) for i in range(5))
            for et, pieces in edges.items()}
    nodes_per_hop = {t: n.per_hop for t, n in types.items()}
    if not hetero:
        row, col, eid, part, pos = cols[None]
        out = SamplerOutput(node[None], _t(row), _t(col), _t(eid), batch[None] if batch else None,
                            nodes_per_hop[None], per_hop[None])
        # called on demand; tensors cross from a worker through shared memory
        out.edge_locator = {None: functools.partial(_pair, torch.from_numpy(part), torch.from_numpy(pos))}
        return out
    out = HeteroSamplerOutput(
        node=node, row={et: _t(e[0]) for et, e in cols.items()}, col={et: _t(e[1]) for et, e in cols.items()},
        edge={et: _t(e[2]) for et, e in cols.items()}, batch=batch, num_sampled_nodes=nodes_per_hop,
        num_sampled_edges=per_hop)
    out.edge_locator = {et: functools.partial(_pair, torch.from_numpy(e[3]), torch.from_numpy(e[4]))
                        for et, e in cols.items()}
    return out


def _pair(part: torch.Tensor, pos: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return part.numpy(), pos.numpy()


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return np.ascontiguousarray(value.detach().cpu().numpy(), np.int64)
    return np.ascontiguousarray(value, np.int64)


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _t(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
