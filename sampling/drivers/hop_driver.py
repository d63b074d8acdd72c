"""The per-hop driver of the sampling engine: heterogeneous graphs, the distributed sampler, stores
holding some partitions. Per hop, one kernel call per edge type (per run of local blocks); the
frontier nodes owned by remote blocks go to their owners first, one request per block per edge type
per hop, answered by the same kernel (``PartitionServer.sample``), while the local part runs here."""

from __future__ import annotations

import functools
from typing import Any, Protocol

import numpy as np
import torch
from numba import njit
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from graphstore.errors import CorruptDatasetError
from sampling.kernels import hop_kernel
from sampling.graph.kernel_args import BlockArgs, Variants
from sampling.kernels.idmap import PERHOP_DENSE_MAX_NODES
from sampling.kernels.frontier import by_id
from sampling.kernels.picks import STRATEGY_LAST, STRATEGY_UNIFORM
from sampling.kernels.structs import Edges, Hop, Scratch
from sampling.distributed.wire import answer_edges, place_sample, span, unpack
from sampling.drivers.batch_driver import fit_buffer

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

    def seed(self, ids: np.ndarray, first: int, room: int = 0) -> None:
        """The seeds ``ids`` (subgraphs from ``first`` when disjoint), with room for ``room`` more nodes (no hop
        regrows the arrays, copying the nodes before it)."""
        self.nodes = np.empty(max(len(ids) + room, 16), np.int64)
        self.batch_of = np.empty(len(self.nodes) if self.disjoint else 0, np.int64)
        seen, dense, table = self.maps
        self.maps[2] = hop_kernel.seed_map(seen, dense, table, ids, self.nodes, self.batch_of, self.num_nodes,
                                         self.disjoint, first)
        self.count = len(ids)
        self.front, self.per_hop = (0, len(ids)), [len(ids)]

    def relabel(self, row: np.ndarray, col: np.ndarray, col_batch: np.ndarray) -> None:
        seen, dense, table = self.maps
        n, valid, self.nodes, self.batch_of, self.maps[2] = hop_kernel.relabel_hop(
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
        hop_kernel.forget_map(seen, table, self.nodes, self.batch_of, self.count, self.num_nodes, self.disjoint)


def node_maps(local: Any, counts: dict[Any, int], disjoint: bool) -> dict[Any, list]:
    """Per node type this thread's de-duplication map ``[seen, dense, table]`` (reused by every batch)."""
    maps = getattr(local, "hop_maps", None)
    if maps is None:
        maps = local.hop_maps = {}
        for t, n in counts.items():
            dense = n <= PERHOP_DENSE_MAX_NODES and not disjoint
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
        most = 0 if hetero else _most_picks(sum(len(ids) for ids in seeds.values()), sampler._fanouts)
        # nodes: room for as many as the thread's last batch sampled edges, and a margin (a hop that needs more
        # grows the array), so that the batch's nodes fill it past half and are handed over without a copy
        # (batch_driver.fit_buffer); a node array sized for the most picks was copied every batch
        seed_times = _seed(types, seeds, times, strict, min(most, getattr(local, "hop_node_room", most)))
        edges = {et: _Edges() for et in sampler.edge_types}
        if most:  # room for the batch's most picks at once: no hop regrows the arrays, copying the last
            edges[None].room(most)
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
    if most:
        local.hop_node_room = edges[None].end + edges[None].end // 4
    return _output(types, edges, per_hop, sampler.disjoint, hetero)


def _most_picks(seeds: int, fanouts: list[dict[Any, int]], cap: int = 1 << 22) -> int:
    """The most edges a homogeneous batch of ``seeds`` can pick over ``fanouts`` (none when a hop takes
    every neighbour, or above ``cap``: those arrays grow as needed)."""
    total, frontier = 0, seeds
    for hop in fanouts:
        k = hop.get(None, 0)
        if k < 0:
            return 0
        frontier *= k
        total += frontier
        if total > cap:
            return 0
    return total


def _seed(types: dict[Any, _Nodes], seeds: dict[Any, Any], times: dict[Any, Any] | None, strict: bool,
          room: int = 0) -> np.ndarray | None:
    offset, all_times = 0, []
    for ntype, ids in seeds.items():
        ids = _numpy(ids)
        types[ntype].seed(ids, offset, room)
        offset += len(ids)
        if times:
            time = _numpy(times[ntype]) if ntype in times else _EMPTY_I
            all_times.append(time - 1 if strict else time)  # int64 times: t' < t <=> t' <= t - 1
    return np.ascontiguousarray(np.concatenate(all_times), np.int64) if times else None


def _hop(sampler: HopSource, local: Any, types: dict[Any, _Nodes], etype: Any, k: int, seed_times: Any,
         exclusion: tuple | None, edges: _Edges) -> int:
    """Sample edge type ``etype`` from its destination type's frontier into ``edges``; returns the edges sampled."""
    topo = sampler.topology[etype]
    dst, src = types[topo.dst_type], types[topo.src_type]
    lo, hi = dst.front
    if hi == lo or k == 0:
        return 0
    ids = dst.nodes[lo:hi]
    limits = None
    if seed_times is not None and (topo.has_time or topo.src_type in sampler.node_time):
        limits = seed_times[dst.batch_of[lo:hi]]
    start = edges.end
    _edge_type(sampler, local, etype, topo, (ids, lo), k, limits, exclusion, edges)
    row, col = edges.row[start:edges.end], edges.col[start:edges.end]
    src.relabel(row, col, dst.batch_of)
    return edges.end - start


class _Edges:
    """One edge type's picks in a batch, hop after hop, in arrays that grow (the kernel writes into them):
    global sources (relabelled in place), frontier positions, edge IDs and CSC positions; each partition's
    edges as runs ``[start, end)`` (a column of partitions is made only when edge attributes ask)."""

    def __init__(self) -> None:
        self.row = self.col = self.eid = self.pos = _EMPTY_I
        # (end of the run, partition, whether its CSC positions were written), in edge order from 0
        self.runs: list[tuple[int, int, int]] = []
        self.end = 0

    def room(self, extra: int) -> None:
        """Make room for ``extra`` more edges."""
        need = self.end + extra
        if need > len(self.row):
            size = max(need, 2 * len(self.row), 1024)
            self.row, self.col, self.eid, self.pos = (_grown(a, size, self.end) for a in
                                                      (self.row, self.col, self.eid, self.pos))

    def ran(self, end: int, part: int, located: int = 1) -> None:
        """The edges up to ``end`` since the last run are partition ``part``'s (``located``: their CSC positions
        were written; else they are -1, written only if asked for: :func:`_pair`)."""
        if self.runs and self.runs[-1][1:] == (part, located):
            self.runs[-1] = (end, part, located)
        elif end > (self.runs[-1][0] if self.runs else 0):
            self.runs.append((end, part, located))

    def put(self, answer: tuple[Any, ...], positions: np.ndarray, part: int, lo: int = 0) -> None:
        """Append a remote partition's answer (as it came over the wire: :func:`sampling.distributed.wire.pack_sample`)
        to the frontier ``positions`` it was asked for (written plus ``lo``), read straight into these arrays."""
        n = answer_edges(answer)
        self.room(n)
        e, end = self.end, self.end + n
        located = answer[3] is not None  # else no pass writes -1 here: _pair does, if a batch asks
        if not place_sample(answer, positions, lo, self.col[e:end], self.row[e:end], self.eid[e:end],
                            self.pos[e:end] if located else self.pos[e:e]):
            counts = np.asarray(unpack(answer[0]), np.int64)
            raise CorruptDatasetError(f"partition {part} answered {n} edges with counts for {len(counts)} nodes "
                                      f"summing to {int(counts.sum())}, for {len(positions)} nodes asked: its "
                                      f"rank's code or data is damaged; run `graphstore verify` on the dataset")
        self.ran(end, part, int(located))
        self.end = end

    def columns(self) -> tuple[np.ndarray, ...]:
        e = self.end
        return self.row[:e], self.col[:e], self.eid[:e], np.array(self.runs, np.int64).reshape(-1, 3), self.pos[:e]


def _grown(a: np.ndarray, size: int, keep: int) -> np.ndarray:
    out = np.empty(size, a.dtype)
    out[:keep] = a[:keep]
    return out


def _edge_type(sampler: HopSource, local: Any, etype: Any, topo: Any, frontier: tuple[np.ndarray, int], k: int,
               limits: Any, exclusion: tuple | None, edges: _Edges) -> None:
    """The picks of the frontier ``(ids, lo)`` appended to ``edges`` (positions in ``ids`` plus ``lo``): the
    remote blocks' nodes requested first, then the local runs sampled here, then the answers read.

    The frontier is sorted by ID once (a radix sort): each block's nodes are then one slice of it, in
    ID order, so an owner reads its CSC in one forward sweep and the local kernel need not sort again."""
    ids, lo = frontier
    runs = sampler.engine_runs(etype)
    c = sampler.config
    if k > 0:
        edges.room(len(ids) * k)  # at most k picks a node: no growing within the hop
    last = c.temporal_strategy == "last"
    strategy = STRATEGY_LAST if last else STRATEGY_UNIFORM
    if len(runs) == 1 and not getattr(runs[0][0], "is_remote", False):  # every block here: one kernel call
        _check_owned(topo, ids)
        _kernel_into(edges, runs[0][0], local.rng, ids, (None, lo), k, c.replace, last, limits, exclusion,
                     in_order=False)
        return
    order, bounds, ordered = _by_id_order(topo, ids)
    pending = []
    for block, (b,) in ((r, i) for r, i in runs if getattr(r, "is_remote", False)):
        s, e = int(bounds[b]), int(bounds[b + 1])
        if e > s:
            sent = limits[order[s:e]] if limits is not None else _EMPTY_I
            seed = int(hop_kernel.draw_seed(local.rng))
            pending.append((s, e, block.part, block.start(ordered[s:e], k, c.replace, sent, strategy, exclusion, seed)))
    for args, members in ((r, i) for r, i in runs if not getattr(r, "is_remote", False)):
        s, e = int(bounds[members[0]]), int(bounds[members[-1] + 1])
        if e > s:
            _kernel_into(edges, args, local.rng, ordered[s:e], (order[s:e], lo), k, c.replace, last,
                         limits[order[s:e]] if limits is not None else None, exclusion, in_order=True)
    for s, e, part, result in pending:
        edges.put(result(), order[s:e], part, lo)


def _by_id_order(topo: Any, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, bounds, ids[order])``: the frontier by ID, block ``b``'s nodes at ``bounds[b]:bounds[b+1]``;
    raises for nodes no block owns."""
    offsets = topo.offsets
    _check_owned(topo, ids)
    if offsets[-1] - offsets[0] < (1 << 31) and len(ids) < (1 << 31):
        return by_id(offsets, np.ascontiguousarray(ids, np.int64), 0, len(ids))
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    return order, np.searchsorted(ordered, offsets), ordered


def _check_owned(topo: Any, ids: np.ndarray) -> None:
    """Raise, naming them, when nodes of ``ids`` lie outside every block of ``topo`` (blocks are contiguous)."""
    if not len(ids):
        return
    lo, hi = span(ids) if ids.dtype == np.int64 and ids.flags.c_contiguous else (ids.min(), ids.max())
    if lo < topo.offsets[0] or hi >= topo.offsets[-1]:
        topo.block_of(ids)


def _kernel_into(edges: _Edges, args: BlockArgs, rng: np.ndarray, ids: np.ndarray,
                 where: tuple[np.ndarray | None, int], k: int, replace: bool, last: bool, limits: Any,
                 exclusion: tuple | None, in_order: bool) -> None:
    """One kernel call for ``ids`` (owned by ``args``' blocks), its picks appended to ``edges``; with ``where =
    (positions, lo)`` their frontier positions are ``positions[i] + lo`` for the i-th of ``ids`` (``i + lo``
    when ``positions`` is ``None``)."""
    positions, lo = where
    start = edges.end
    block_edges = np.zeros(len(args.offsets), np.int64)
    e, out = _picks(args, rng, ids, k, replace, last, limits, exclusion, in_order,
                    Edges(edges.row, edges.col, edges.eid, edges.pos), start, block_edges)
    edges.row, edges.col, edges.eid, edges.pos = out
    edges.end = e
    if positions is not None:
        _translate(edges.col[start:e], positions, lo)
    elif lo:
        edges.col[start:e] += lo
    for b in range(len(args.parts)):
        edges.ran(int(block_edges[b + 1]), int(args.parts[b]))


@njit(cache=True, nogil=True)
def _translate(col, positions, lo):
    """``col[i] = positions[col[i]] + lo`` in place."""
    for i in range(len(col)):
        col[i] = positions[col[i]] + lo


def run_kernel(args: BlockArgs, rng: np.ndarray, ids: np.ndarray, k: int, replace: bool, last: bool, limits: Any,
               exclusion: tuple | None, in_order: bool) -> tuple[np.ndarray, ...]:
    """One hop of ``ids`` (owned by ``args``' blocks): ``(sources, positions in ids, edge IDs, CSC
    positions, each block's first edge)``."""
    block_edges = np.zeros(len(args.offsets), np.int64)
    e, (row, col, eid, pos) = _picks(args, rng, ids, k, replace, last, limits, exclusion, in_order,
                                     Edges(_EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_I), 0, block_edges)
    return row[:e], col[:e], eid[:e], pos[:e], block_edges


def _picks(args: BlockArgs, rng: np.ndarray, ids: np.ndarray, k: int, replace: bool, last: bool, limits: Any,
           exclusion: tuple | None, in_order: bool, out: Edges, start: int, block_edges: np.ndarray
           ) -> tuple[int, Edges]:
    """The kernel call: picks written into ``out`` from ``start`` (grown as needed), CSC positions."""
    ids = np.ascontiguousarray(ids, np.int64)
    if limits is not None and args.timed:
        limits = np.ascontiguousarray(limits, np.int64)
    else:
        limits = None
    var = args.var(last, limits is not None, exclusion)
    hop = Hop(ids, 0, len(ids), int(k), bool(replace), bool(in_order), limits)
    e, out, _, _ = hop_kernel.hop_picks(args.topo, var, hop, rng, out, np.int64(start), block_edges,
                                        Scratch(_EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_F))
    if BlockArgs.time_sorted(var):  # picks in time order: their CSC positions
        args.csc_positions(out.pos[start:e], block_edges - start)
    return e, out


def _output(types: dict[Any, _Nodes], edges: dict[Any, _Edges], per_hop: dict[Any, list[int]], disjoint: bool,
            hetero: bool) -> SamplerOutput | HeteroSamplerOutput:
    node = {t: torch.from_numpy(fit_buffer(n.nodes[:n.count], len(n.nodes))) for t, n in types.items()}
    batch = ({t: torch.from_numpy(fit_buffer(n.batch_of[:n.count], len(n.batch_of))) for t, n in types.items()}
             if disjoint else None)
    cols = {et: acc.columns() for et, acc in edges.items()}
    nodes_per_hop = {t: n.per_hop for t, n in types.items()}
    if not hetero:
        row, col, eid, runs, pos = cols[None]
        out = SamplerOutput(node[None], _t(row), _t(col), _t(eid), batch[None] if batch else None,
                            nodes_per_hop[None], per_hop[None])
        # called on demand; tensors cross from a worker through shared memory
        out.edge_locator = {None: functools.partial(_pair, torch.from_numpy(runs), torch.from_numpy(pos))}
        return out
    out = HeteroSamplerOutput(
        node=node, row={et: _t(e[0]) for et, e in cols.items()}, col={et: _t(e[1]) for et, e in cols.items()},
        edge={et: _t(e[2]) for et, e in cols.items()}, batch=batch, num_sampled_nodes=nodes_per_hop,
        num_sampled_edges=per_hop)
    out.edge_locator = {et: functools.partial(_pair, torch.from_numpy(e[3]), torch.from_numpy(e[4]))
                        for et, e in cols.items()}
    return out


def _pair(runs: torch.Tensor, pos: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(partition, CSC position)`` of every sampled edge, from the runs of each partition's edges (-1 as the
    position of a remote edge whose answer carried none)."""
    ends, parts, located = runs.numpy()[:, 0], runs.numpy()[:, 1], runs.numpy()[:, 2]
    positions = pos.numpy()
    for r in np.flatnonzero(located == 0):
        positions[(ends[r - 1] if r else 0):ends[r]] = -1
    return np.repeat(parts.astype(np.int32), np.diff(ends, prepend=0)), positions


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return np.ascontiguousarray(value.detach().cpu().numpy(), np.int64)
    return np.ascontiguousarray(value, np.int64)


def _t(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
