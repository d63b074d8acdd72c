"""The sampling kernel, phased, with its per-edge variants: weighted, temporal, disjoint and edge-masked
(every variant off: the plain path; there is no other sampler).

One hop is :func:`hop_picks` (the frontier sorted by block/ID, pointer reads, the picks of
:mod:`sampling.kernels.picks`, gathers); de-duplication is :mod:`sampling.kernels.idmap`. Two drivers call them:
:func:`sample_variants` runs every hop of a homogeneous batch in one call, and
:mod:`sampling.drivers.hop_driver` runs one call per edge type per hop (heterogeneous graphs, the distributed
sampler, the partition servers). A variant that is off is passed as ``None`` (see
:mod:`sampling.kernels.picks`), so numba compiles one specialisation per combination.

- disjoint: nodes are keyed by (subgraph, node), so each seed's subgraph holds its own copy of every
  node it reaches; each local node's subgraph is kept beside its ID.
- temporal: each frontier node's limit is its subgraph's seed time (``seed_times``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphstore.jitcache import announce_compiles
from sampling.kernels.idmap import (dedup_dense, dedup_disjoint, dedup_hash, dedup_subgraphs, forget, forget_disjoint,
                            insert_seeds, insert_seeds_disjoint, pow2, rehash)
from sampling.kernels.frontier import AHEAD_EDGES, by_block, by_id, gather_picked, grow, buffer_len
from sampling.kernels import unmapped
from sampling.kernels.picks import pick_block
from sampling.kernels.cacheline import prefetch
from sampling.kernels.rng import next_u64

# a run that has to compile the kernels says so once, instead of a silent first batch
announce_compiles("sampling", "about a minute")

# Literal zeros: a variable that starts as ``0`` and is reassigned in a loop is typed ``Literal[int](0)``
# first, and numba compiles every kernel it is passed to twice, for that literal and for int64 (89 of the
# 238 specialisations of a cold cache, measured). So the counters passed to kernels start as np.int64(0).


@njit(cache=True, nogil=True)
def _room(row, col, eid, pos, bufs, need, max_deg):
    if need > len(row):
        row, col, eid, pos = grow(row, need), grow(col, need), grow(eid, need), grow(pos, need)
    if len(bufs[0]) < max_deg:
        bufs = (np.empty(max_deg, np.int64), np.empty(max_deg, np.int64), np.empty(max_deg, np.int64),
                np.empty(max_deg, np.float64))
    return row, col, eid, pos, bufs


@njit(cache=True, nogil=True)
def hop_picks(topo, nodes, f_lo, f_hi, k, replace, state, in_order, out, n_edges, block_edges, bufs, var, limits):
    """One hop for the frontier ``nodes[f_lo:f_hi]`` (each owned by a block of ``topo``): phases 1 to 3.

    ``topo`` = ``(indptrs, indices, eids, packed, use_packed, offsets, files)``: per-block tuples (block ``b``
    owns destinations ``[offsets[b], offsets[b+1])``) of the CSC arrays, or of ``packed`` int32 values,
    ``use_packed`` of them per edge (source and edge ID first; 0: not used), ``files`` the blocks' chunk
    descriptors when they are read, not mapped (:mod:`sampling.kernels.unmapped`; the plain picks only), else
    ``None``; ``out`` = ``(row, col,
    eid, pos)``, written from ``n_edges`` on (grown as needed): global source IDs, frontier positions,
    edge IDs, CSC positions.
    ``block_edges[b]`` gets block ``b``'s first edge; with time-sorted edges (``var[7]``) the positions
    are theirs (:func:`variants_csc` translates them). ``in_order``: visit the frontier in its own
    order within a block (else, for large frontiers, by ID). ``var`` = ``(src, stride, weights,
    aliases, astride, amask, times, tcuts, node_time, last, splits, allowed, excl, excl_mul, excl_mode)``
    (:func:`sampling.kernels.picks.pick_block`), ``limits`` per frontier node or ``None``. Returns
    ``(end, out, bufs)``.
    """
    indptrs, indices, eids, packed, use_packed, offsets, files = topo
    row, col, eid, pos = out
    nf = f_hi - f_lo
    if not in_order and nf >= 4096 and offsets[-1] - offsets[0] < (1 << 31):
        order, bounds, ids = by_id(offsets, nodes, f_lo, f_hi)
    else:
        order, bounds, ids = by_block(offsets, nodes, f_lo, f_hi)
    starts, degs = np.empty(nf, np.int64), np.empty(nf, np.int64)
    unmapped.pointers(files, indptrs, offsets, ids, bounds, starts, degs)
    total, max_deg = 0, np.int64(0)  # see the note on literal zeros
    for t in range(nf):
        d = degs[t]
        total += d if (k < 0 or (not replace and d < k)) else (k if d > 0 else 0)
        max_deg = max(max_deg, d)
    row, col, eid, pos, bufs = _room(row, col, eid, pos, bufs, n_edges + total, max_deg)
    e = unmapped.picks(files, state, starts, degs, order, bounds, k, replace, f_lo, pos, col, n_edges, bufs[0], row,
                       eid, block_edges)
    if e >= 0:  # read, not mapped: the plain picks over this hop's copy of the frontier's pairs
        return e, (row, col, eid, pos), bufs
    src, stride, weights, aliases, astride, amask, times, tsort, node_time, last, splits, allowed, excl, mul, mode = var
    # the picks read each picked pair themselves (no phase 3) over the layouts that hold it beside what they
    # read anyway: the weighted packed records, the plain packed pairs, blocked time records
    plain = weights is None and limits is None and splits is None and excl is None
    gathered = (tsort is None and ((aliases is not None and use_packed >= 3) or (plain and use_packed == 2))
                or _blocked(tsort))
    indirect = weights is not None or splits is not None or excl is not None
    ends = np.empty(nf if indirect and _blocked(tsort) else 0, np.int64)  # the picks over time records need them
    e = n_edges
    for b in range(len(offsets) - 1):
        block_edges[b] = e
        e = pick_block(state, b, starts, degs, order, ids, bounds, k, replace, f_lo, pos, col, e, bufs, ends, src,
                       stride, weights, aliases, astride, amask, times, tsort, node_time, limits, last, splits, allowed,
                       excl, mul, mode, gathered, row, eid)
    block_edges[len(offsets) - 1] = e
    if not gathered:
        _gather_picks(tsort, packed, use_packed, indices, eids, block_edges, pos, row, eid)
    return e, (row, col, eid, pos), bufs


@njit(cache=True, nogil=True)
def _blocked(tsort):
    """Whether the picks are over blocked time records (:func:`sampling.graph.derived.time_records`), whose
    pairs they read themselves."""
    if tsort is None:
        return False
    return tsort[3][0, 2] != 0


@njit(cache=True, nogil=True)
def _gather_picks(tsort, packed, use_packed, indices, eids, block_edges, pos, row, eid):
    """Phase 3: from the time-sorted pairs when the picks are theirs, else over the packed pairs when
    they are used, else the separate arrays."""
    if tsort is not None:  # the picks are time-sorted positions: their pairs (apart) are in that order
        _gather_strided(tsort[1], np.int64(2), block_edges, pos, row, eid)  # as the packed pairs' stride
    elif use_packed:
        _gather_strided(packed, int(use_packed), block_edges, pos, row, eid)
    else:
        gather_picked(indices, eids, block_edges, pos, row, eid)


@njit(cache=True, nogil=True)
def _gather_strided(packed, stride, edge_bounds, pos, row, eid):
    """Phase 3 over a layout of ``stride`` values per edge, source and edge ID first (the stored pairs,
    or the time-sorted ones of :func:`sampling.graph.derived.time_records` apart: 2)."""
    for b in range(len(edge_bounds) - 1):
        pk = packed[b]
        for x in range(edge_bounds[b], edge_bounds[b + 1]):
            if x + AHEAD_EDGES < edge_bounds[b + 1]:
                prefetch(pk, stride * pos[x + AHEAD_EDGES])
            row[x] = pk[stride * pos[x]]
            eid[x] = pk[stride * pos[x] + 1]


@njit(cache=True, nogil=True)
def variants_csc(orders, block_edges, pos):
    """Time-sorted positions to CSC positions, in place: ``block_edges`` rows (one per hop) of each
    block's first edge and the end, ``orders[b]`` block ``b``'s CSC position of each sorted one."""
    for h in range(block_edges.shape[0]):
        for b in range(block_edges.shape[1] - 1):
            order = orders[b]
            for x in range(block_edges[h, b], block_edges[h, b + 1]):
                pos[x] = order[pos[x]]


@njit(cache=True, nogil=True)
def _limits(batch_of, f_lo, f_hi, seed_times):
    """Each frontier node's time limit: its subgraph's seed time."""
    limits = np.empty(f_hi - f_lo, np.int64)
    for i in range(f_hi - f_lo):
        limits[i] = seed_times[batch_of[f_lo + i]]
    return limits


@njit(cache=True, nogil=True)
def _hop_limits(batch_of, f_lo, f_hi, seed_times):
    if seed_times is None:
        return None
    return _limits(batch_of, f_lo, f_hi, seed_times)


@njit(cache=True, nogil=True)
def _relabel(seen, dense, table, row, col, lo, hi, nodes, batch_of, n_nodes, num_nodes, disjoint):
    """Phase 4: local IDs of the sampled sources, appending new nodes. Returns ``(n_nodes, valid,
    table)``; invalid when a source ID is not a node ID (a damaged dataset)."""
    if len(seen):
        n_nodes, valid = dedup_dense(seen, dense, row, lo, hi, nodes, n_nodes, num_nodes)
        return n_nodes, valid, table
    if len(table) < 4 * (n_nodes + hi - lo):
        table = rehash(table, pow2(4 * (n_nodes + hi - lo)))
    if disjoint:
        n_nodes, valid = dedup_disjoint(table, row, col, batch_of, lo, hi, nodes, batch_of, n_nodes, num_nodes)
    else:
        n_nodes, valid = dedup_hash(table, row, lo, hi, nodes, n_nodes, num_nodes)
    return n_nodes, valid, table


@njit(cache=True, nogil=True)
def _forget(seen, table, nodes, batch_of, n_nodes, num_nodes, disjoint):
    if disjoint:
        forget_disjoint(table, nodes, batch_of, n_nodes, num_nodes)
    else:
        forget(seen, table, nodes, n_nodes)


@njit(cache=True, nogil=True)
def sample_variants(topo, seeds, fanouts, replace, state, seen, dense, table, num_nodes, disjoint, var, seed_times):
    """Sample every hop of one batch with the variants ``var`` (as for :func:`hop_picks`).

    The one sampling kernel: every variant off (``var`` of ``None`` s, not disjoint) is the plain path.
    ``topo`` as for :func:`hop_picks`. Global IDs map to local ones through ``seen`` (uint64 bitmap
    over the nodes, all 0) with ``dense`` (int32, one entry per node, any content), or, when ``seen`` is
    empty, through ``table`` (interleaved int64 key/value hash, all -1); either is left empty again
    (when disjoint ``seen`` must be empty: a per-subgraph table is used). ``seed_times``: per seed, or
    ``None`` (needs ``disjoint``). Returns ``(nodes, row, col, edge_ids, edge_positions, block_edges,
    nodes_per_hop, edges_per_hop, table, batch_of)``: ``row``/``col`` local source/destination IDs;
    ``block_edges[h, b]`` the first edge of hop ``h`` in block ``b`` (edges are grouped by block within
    a hop); ``batch_of`` each node's subgraph (the position of its seed; empty when not disjoint). If a
    neighbor ID is not a node ID (a damaged dataset) it stops, with ``nodes_per_hop[0] = -1``.
    """
    num_seeds, num_blocks, hops = len(seeds), len(topo[5]) - 1, len(fanouts)
    cap = buffer_len(num_seeds, fanouts)
    nodes = np.empty(num_seeds + cap, np.int64)
    batch_of = np.empty(num_seeds + cap if disjoint else 0, np.int64)  # of every local node: its subgraph
    out = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64))
    block_edges = np.zeros((hops, num_blocks + 1), np.int64)
    nodes_per_hop, edges_per_hop = np.zeros(hops + 1, np.int64), np.zeros(hops, np.int64)
    starts = np.zeros((hops + 1, num_seeds + 1), np.int64)  # disjoint: each subgraph's nodes per hop
    sub_slots = np.zeros(0, np.int64)  # disjoint: one subgraph's map
    if disjoint:
        for i in range(num_seeds):
            nodes[i], batch_of[i], starts[0, i] = seeds[i], i, i
        starts[0, num_seeds] = num_seeds
    else:
        if len(seen) == 0 and len(table) < 4 * num_seeds:
            table = rehash(table, pow2(4 * num_seeds))
        insert_seeds(seen, dense, table, seeds, nodes)
    n_nodes, n_edges, f_lo, f_hi = num_seeds, np.int64(0), np.int64(0), num_seeds  # note on literal zeros
    nodes_per_hop[0] = num_seeds
    bufs = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    for h in range(hops):
        k = fanouts[h]
        block_edges[h, :] = n_edges
        if k == 0 or f_hi == f_lo:
            f_lo = f_hi = n_nodes
            starts[h + 1, :] = n_nodes
            continue
        limits = _hop_limits(batch_of, f_lo, f_hi, seed_times)
        e, out, bufs = hop_picks(topo, nodes, f_lo, f_hi, k, replace, state, disjoint, out, n_edges, block_edges[h],
                                 bufs, var, limits)
        if n_nodes + e - n_edges > len(nodes):
            nodes = grow(nodes, n_nodes + e - n_edges)
            if disjoint:
                batch_of = grow(batch_of, n_nodes + e - n_edges)
        if disjoint:
            n_nodes, valid, sub_slots = dedup_subgraphs(out[0], out[1], n_edges, e, f_lo, f_hi, nodes, batch_of,
                                                        n_nodes, num_nodes, starts, h, sub_slots)
        else:
            n_nodes, valid, table = _relabel(seen, dense, table, out[0], out[1], n_edges, e, nodes, batch_of,
                                             n_nodes, num_nodes, False)
        if not valid:
            if not disjoint:
                forget(seen, table, nodes, n_nodes)
            nodes_per_hop[0] = -1
            return (nodes[:0], out[0][:0], out[1][:0], out[2][:0], out[3][:0], block_edges, nodes_per_hop,
                    edges_per_hop, table, batch_of[:0])
        edges_per_hop[h] = e - n_edges
        n_edges = e
        f_lo, f_hi = f_hi, n_nodes
        nodes_per_hop[h + 1] = f_hi - f_lo
    if not disjoint:
        forget(seen, table, nodes, n_nodes)
    row, col, eid, pos = out
    return (nodes[:n_nodes], row[:n_edges], col[:n_edges], eid[:n_edges], pos[:n_edges], block_edges,
            nodes_per_hop, edges_per_hop, table, batch_of[:n_nodes])


@njit(cache=True, nogil=True)
def relabel_hop(seen, dense, table, row, col, col_batch, nodes, batch_of, n_nodes, num_nodes, disjoint):
    """Phase 4 of the per-hop driver: ``row`` (global source IDs, relabelled in place) into one node
    type's map, new nodes appended to ``nodes`` (and, disjoint, their subgraph ``col_batch[col[x]]`` to
    ``batch_of``), both grown as needed. Returns ``(n_nodes, valid, nodes, batch_of, table)``."""
    need = n_nodes + len(row)
    if need > len(nodes):
        nodes = grow(nodes, need)
        if disjoint:
            batch_of = grow(batch_of, need)
    n_nodes, valid, table = _relabel_from(seen, dense, table, row, col, col_batch, nodes, batch_of, n_nodes,
                                          num_nodes, disjoint)
    return n_nodes, valid, nodes, batch_of, table


@njit(cache=True, nogil=True)
def _relabel_from(seen, dense, table, row, col, col_batch, nodes, batch_of, n_nodes, num_nodes, disjoint):
    lo = np.int64(0)  # as _relabel passes it (see the note on literal zeros)
    if len(seen):
        n_nodes, valid = dedup_dense(seen, dense, row, lo, len(row), nodes, n_nodes, num_nodes)
        return n_nodes, valid, table
    if len(table) < 4 * (n_nodes + len(row)):
        table = rehash(table, pow2(4 * (n_nodes + len(row))))
    if disjoint:
        n_nodes, valid = dedup_disjoint(table, row, col, col_batch, lo, len(row), nodes, batch_of, n_nodes, num_nodes)
    else:
        n_nodes, valid = dedup_hash(table, row, lo, len(row), nodes, n_nodes, num_nodes)
    return n_nodes, valid, table


@njit(cache=True, nogil=True)
def seed_map(seen, dense, table, seeds, nodes, batch_of, num_nodes, disjoint, first):
    """Seeds of one node type take local IDs ``0..len(seeds)-1`` (disjoint: subgraphs ``first + i``);
    returns the table (grown as needed)."""
    if len(seen) == 0 and len(table) < 4 * len(seeds):
        table = rehash(table, pow2(4 * len(seeds)))
    if disjoint:
        insert_seeds_disjoint(table, seeds, nodes, batch_of, num_nodes, first)
    else:
        insert_seeds(seen, dense, table, seeds, nodes)
    return table


@njit(cache=True, nogil=True)
def forget_map(seen, table, nodes, batch_of, n_nodes, num_nodes, disjoint):
    """Empty one node type's map after a batch (O(nodes sampled))."""
    _forget(seen, table, nodes, batch_of, n_nodes, num_nodes, disjoint)


@njit(cache=True, nogil=True)
def draw_seed(state):
    """63 random bits from the generator ``state`` (seeds a remote request's draws)."""
    r, state[0], state[1], state[2], state[3] = next_u64(state[0], state[1], state[2], state[3])
    return np.int64(r >> np.uint64(1))
