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
from sampling.kernels.frontier import AHEAD_EDGES, by_block, by_id, gather_picked, grow, start_len
from sampling.kernels import unmapped
from sampling.kernels.picks import most_picks as _most_picks, pick_block
from sampling.kernels.cacheline import prefetch
from sampling.kernels.structs import Edges, Frontier, Hop, Scratch
from sampling.kernels.rng import next_u64

# Under a time limit, a mask or an exclusion a hop makes room for its picks a run of frontier nodes at a
# time, each run's most picks (at most this many, or one node's), so the room a batch reports needing ends
# near what it wrote, not at its frontier's most picks: it writes far fewer, and the next batch's buffers,
# sized by that room, were then copied out half empty every batch (``fit_buffer``: a tenth of a temporal
# batch's time at [20, 20] with half the edges eligible). Other picks write their most: one run a block.
_RUN_PICKS = 1 << 14

# a run that has to compile the kernels says so once, instead of a silent first batch
announce_compiles("sampling", "about a minute")

# Literal zeros: a variable that starts as ``0`` and is reassigned in a loop is typed ``Literal[int](0)``
# first, and numba compiles every kernel it is passed to twice, for that literal and for int64 (89 of the
# 238 specialisations of a cold cache, measured). So the counters passed to kernels start as np.int64(0).


@njit(cache=True, nogil=True)
def _room(out, bufs, need, max_deg):
    if need > len(out.row):
        out = Edges(grow(out.row, need), grow(out.col, need), grow(out.eid, need), grow(out.pos, need))
    if len(bufs.draws) < max_deg:
        bufs = Scratch(np.empty(max_deg, np.int64), np.empty(max_deg, np.int64), np.empty(max_deg, np.int64),
                       np.empty(max_deg, np.float64))
    return out, bufs


@njit(cache=True, nogil=True)
def hop_picks(topo, var, hop, state, out, n_edges, block_edges, bufs):
    """One hop, phases 1 to 3: the picks of ``hop``'s frontier (a :class:`~sampling.kernels.structs.Hop`,
    each node owned by a block of the :class:`~sampling.kernels.structs.Topology` ``topo``) under the
    variants ``var`` (:class:`~sampling.kernels.structs.VariantArrays`; ``hop.limits`` per frontier node
    or ``None``), with the generator ``state``.

    ``out`` (:class:`~sampling.kernels.structs.Edges`) is written from ``n_edges`` on, grown as needed:
    global source IDs, frontier positions (from ``hop.lo``), edge IDs, CSC positions. ``bufs``
    (:class:`~sampling.kernels.structs.Scratch`) is grown as needed. ``block_edges[b]`` gets block ``b``'s
    first edge; with time-sorted edges (``var.tsort``) the positions are theirs (:func:`variants_csc`
    translates them). Blocks read, not mapped (``topo.files``), take the plain picks of
    :mod:`sampling.kernels.unmapped`. Returns ``(end, out, bufs, need)``, ``need`` the room ``out`` had to
    have for the hop: room is made for a run of frontier nodes at a time (:data:`_RUN_PICKS`; a block at a time
    when every node writes its most picks), so it is the most, over the runs, of the edges before a run and its
    nodes' most picks.
    """
    nf = hop.hi - hop.lo
    offsets, files = topo.offsets, topo.files
    if not hop.in_order and nf >= 4096 and offsets[-1] - offsets[0] < (1 << 31):
        order, bounds, ids = by_id(offsets, hop.nodes, hop.lo, hop.hi)
    else:
        order, bounds, ids = by_block(offsets, hop.nodes, hop.lo, hop.hi)
    fr = Frontier(order, bounds, ids, np.empty(nf, np.int64), np.empty(nf, np.int64))
    unmapped.pointers(files, topo.indptrs, offsets, ids, bounds, fr.starts, fr.degs)
    k, replace, degs = hop.k, hop.replace, fr.degs
    total, max_deg = 0, np.int64(0)  # see the note on literal zeros
    for t in range(nf):
        total += _most_picks(degs[t], k, replace)
        max_deg = max(max_deg, degs[t])
    if files is not None:  # read, not mapped: the plain picks over this hop's copy of the frontier's pairs
        out, bufs = _room(out, bufs, n_edges + total, max_deg)
        e = unmapped.picks(files, state, fr, k, replace, hop.lo, out, n_edges, bufs.draws, block_edges)
        return e, out, bufs, n_edges + total
    out, bufs = _room(out, bufs, n_edges, max_deg)  # the draws' scratch; the edges' room run by run below
    tsort, aliases, use_packed = var.tsort, var.aliases, topo.use_packed
    # the picks read each picked pair themselves (no phase 3) over the layouts that hold it beside what they
    # read anyway: the weighted packed records, the plain packed pairs, blocked time records
    uniform = var.weights is None and hop.limits is None  # plain, or masked (:func:`_pick_masked`)
    gathered = (tsort is None and ((aliases is not None and use_packed >= 3) or (uniform and use_packed == 2))
                or _blocked(tsort))
    indirect = var.weights is not None or var.splits is not None or var.excl is not None
    ends = np.empty(nf if indirect and _blocked(tsort) else 0, np.int64)  # the picks over time records need them
    e = need = n_edges
    done = np.int64(0)  # the most picks of the runs before
    # runs only where a node may yield fewer than its most picks (a time limit, a mask, an exclusion): else one
    # run a block, as the most picks are what it writes
    run_picks = _RUN_PICKS if hop.limits is not None or var.splits is not None or var.excl is not None else total
    for b in range(len(offsets) - 1):
        block_edges[b] = e
        t_lo = fr.bounds[b]
        while t_lo < fr.bounds[b + 1]:  # in runs of at most _RUN_PICKS picks (or one node), room made for each
            t_hi, most = t_lo, np.int64(0)
            while t_hi < fr.bounds[b + 1]:
                m = _most_picks(degs[t_hi], k, replace)
                if most + m > run_picks and t_hi > t_lo:
                    break
                most += m
                t_hi += 1
            need = max(need, e + most)
            if e + most > len(out.row):  # grown once a hop at most: room for the rest of its most picks
                out = _grown(out, e, max(e + total - done, 2 * len(out.row)))
            e = pick_block(state, b, t_lo, t_hi, fr, hop, var, out, e, bufs, ends, gathered)
            done += most
            t_lo = t_hi
    block_edges[len(offsets) - 1] = e
    if not gathered:
        _gather_picks(tsort, topo.packed, use_packed, topo.indices, topo.eids, block_edges, out)
    return e, out, bufs, need


@njit(cache=True, nogil=True)
def _grown(out, used, size):
    """``out``'s arrays in new ones of ``size`` entries, their first ``used`` copied (the rest was never written)."""
    grown = Edges(np.empty(size, out.row.dtype), np.empty(size, out.col.dtype), np.empty(size, out.eid.dtype),
                  np.empty(size, out.pos.dtype))
    grown.row[:used], grown.col[:used], grown.eid[:used], grown.pos[:used] = (out.row[:used], out.col[:used],
                                                                              out.eid[:used], out.pos[:used])
    return grown


@njit(cache=True, nogil=True)
def _blocked(tsort):
    """Whether the picks are over blocked time records (:func:`sampling.graph.derived.time_records`), whose
    pairs they read themselves."""
    if tsort is None:
        return False
    return tsort.blocked[0] != 0


@njit(cache=True, nogil=True)
def _gather_picks(tsort, packed, use_packed, indices, eids, block_edges, out):
    """Phase 3: from the time-sorted pairs when the picks are theirs, else over the packed pairs when
    they are used, else the separate arrays."""
    pos, row, eid = out.pos, out.row, out.eid
    if tsort is not None:  # the picks are time-sorted positions: their pairs (apart) are in that order
        _gather_sorted(tsort.pairs, packed, int(use_packed), indices, eids, block_edges, pos, row, eid)
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
def _gather_sorted(pairs, packed, stride, indices, eids, edge_bounds, pos, row, eid):
    """Phase 3 over apart time records: a time-sorted position's pair from ``pairs``, a CSC one (complemented,
    negative: a node whose every edge was eligible, :func:`sampling.kernels.picks._csc_where_eligible`) from
    the CSC pairs (``packed``, ``stride`` values an edge, when the blocks have them: apart records of 64-bit
    keys) or the CSC arrays."""
    for b in range(len(edge_bounds) - 1):
        pk, csc, src, ids = pairs[b], packed[b], indices[b], eids[b]
        for x in range(edge_bounds[b], edge_bounds[b + 1]):
            p = pos[x]
            if x + AHEAD_EDGES < edge_bounds[b + 1] and pos[x + AHEAD_EDGES] >= 0:
                prefetch(pk, 2 * pos[x + AHEAD_EDGES])
            if p >= 0:
                row[x], eid[x] = pk[2 * p], pk[2 * p + 1]
            elif stride:
                row[x], eid[x] = csc[stride * ~p], csc[stride * ~p + 1]
            else:
                row[x], eid[x] = src[~p], ids[~p]


@njit(cache=True, nogil=True)
def variants_csc(orders, block_edges, pos):
    """Time-sorted positions to CSC positions, in place: ``block_edges`` rows (one per hop) of each
    block's first edge and the end, ``orders[b]`` block ``b``'s CSC position of each sorted one. A negative
    position is a CSC one already, complemented (``~p``: a node whose every edge was eligible,
    :func:`sampling.kernels.picks._pick_blocked`)."""
    for h in range(block_edges.shape[0]):
        for b in range(block_edges.shape[1] - 1):
            order = orders[b]
            for x in range(block_edges[h, b], block_edges[h, b + 1]):
                p = pos[x]
                pos[x] = order[p] if p >= 0 else ~p


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
def sample_variants(topo, seeds, fanouts, replace, state, ids, num_nodes, disjoint, var, seed_times, sizes):
    """Sample every hop of one batch with the variants ``var`` (as for :func:`hop_picks`).

    The one sampling kernel: every variant off (``var`` of ``None`` s, not disjoint) is the plain path.
    ``topo`` as for :func:`hop_picks`. Global IDs map to local ones through the
    :class:`~sampling.kernels.structs.IdMap` ``ids``: ``seen`` (uint64 bitmap over the nodes, all 0) with
    ``dense`` (int32, one entry per node, any content), or, when ``seen`` is empty, ``table`` (interleaved
    int64 key/value hash, all -1); either is left empty again (when disjoint ``seen`` must be empty: a
    per-subgraph table is used). ``seed_times``: per seed, or ``None`` (needs ``disjoint``).

    ``sizes`` (int64, 4): in ``sizes[0]``/``sizes[1]`` the edges and nodes the output buffers start with
    (0: room for the most a batch of these fanouts can sample,
    :func:`~sampling.kernels.frontier.buffer_len`); on return the room they have there, and in
    ``sizes[2]``/``sizes[3]`` the room this batch needed (the most edges its picks could write, the most
    nodes before de-duplication), for the caller to size the next batch's buffers by.

    Returns ``(nodes, row, col, edge_ids, edge_positions, block_edges, nodes_per_hop, edges_per_hop, table,
    batch_of)``: ``row``/``col`` local source/destination IDs; ``block_edges[h, b]`` the first edge of hop
    ``h`` in block ``b`` (edges are grouped by block within a hop); ``batch_of`` each node's subgraph (the
    position of its seed; empty when not disjoint). If a neighbor ID is not a node ID (a damaged dataset)
    it stops, with ``nodes_per_hop[0] = -1``.
    """
    seen, dense, table = ids
    num_seeds, num_blocks, hops = len(seeds), len(topo.offsets) - 1, len(fanouts)
    cap = start_len(num_seeds, fanouts, sizes[0])
    node_cap = num_seeds + cap if sizes[1] <= 0 else max(num_seeds, min(sizes[1], num_seeds + cap))
    nodes = np.empty(node_cap, np.int64)
    batch_of = np.empty(node_cap if disjoint else 0, np.int64)  # of every local node: its subgraph
    out = Edges(np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64))
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
    sizes[2], sizes[3] = 0, num_seeds
    n_nodes, n_edges, f_lo, f_hi = num_seeds, np.int64(0), np.int64(0), num_seeds  # note on literal zeros
    nodes_per_hop[0] = num_seeds
    bufs = Scratch(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    for h in range(hops):
        k = fanouts[h]
        block_edges[h, :] = n_edges
        if k == 0 or f_hi == f_lo:
            f_lo = f_hi = n_nodes
            starts[h + 1, :] = n_nodes
            continue
        limits = _hop_limits(batch_of, f_lo, f_hi, seed_times)
        hop = Hop(nodes, f_lo, f_hi, k, replace, disjoint, limits)
        e, out, bufs, need = hop_picks(topo, var, hop, state, out, n_edges, block_edges[h], bufs)
        sizes[2], sizes[3] = max(sizes[2], need), max(sizes[3], n_nodes + e - n_edges)
        if n_nodes + e - n_edges > len(nodes):
            nodes = grow(nodes, n_nodes + e - n_edges)
            if disjoint:
                batch_of = grow(batch_of, n_nodes + e - n_edges)
        if disjoint:
            n_nodes, valid, sub_slots = dedup_subgraphs(out, n_edges, e, f_lo, f_hi, nodes, batch_of, n_nodes,
                                                        num_nodes, starts, h, sub_slots)
        else:
            n_nodes, valid, table = _relabel(seen, dense, table, out.row, out.col, n_edges, e, nodes, batch_of,
                                             n_nodes, num_nodes, False)
        if not valid:
            if not disjoint:
                forget(seen, table, nodes, n_nodes)
            nodes_per_hop[0] = -1
            return (nodes[:0], out.row[:0], out.col[:0], out.eid[:0], out.pos[:0], block_edges, nodes_per_hop,
                    edges_per_hop, table, batch_of[:0])
        edges_per_hop[h] = e - n_edges
        n_edges = e
        f_lo, f_hi = f_hi, n_nodes
        nodes_per_hop[h + 1] = f_hi - f_lo
    if not disjoint:
        forget(seen, table, nodes, n_nodes)
    sizes[0], sizes[1] = len(out.row), len(nodes)
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
