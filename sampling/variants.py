"""The phased multi-hop kernel with its per-edge variants: weighted, temporal, disjoint and edge-masked.

Same phases as :func:`sampling.multihop.sample_multihop` (frontier sorted by block/ID, pointer
reads, picks, gathers, de-duplication), with the per-edge decisions of the picks phase chosen by
argument *types*: a variant that is off is passed as ``None``, and numba compiles (and caches) one
specialisation per combination with the untaken branches pruned, so no variant pays for another.

- weighted: ``cumws`` holds per block the cumulative weight of each edge within its destination's
  CSC segment (:func:`cumulative_weights`, built once per process per block); a pick is one draw and
  a binary search, without replacement successive draws (a repeated edge is redrawn; after a few
  repeats the remaining picks are drawn exactly from the weights left).
- temporal: ``seed_times`` (per subgraph) with ``times`` (per CSC position) and/or ``node_time``
  (per source node): an edge is a candidate when its time is at or before its subgraph's seed time.
  The CSC is sorted by (destination, source), not by time, so the cut is a linear scan over the
  destination's edges; ``last`` takes the ``k`` latest candidates (ties: the earlier CSC position).
- disjoint: nodes are keyed ``subgraph * num_nodes + node`` in the de-duplication hash table, so
  each seed's subgraph holds its own copy of every node it reaches; each local node's subgraph is
  kept beside its ID (no division to decode keys).
- edge mask: ``splits`` (link split per CSC position) admits edges whose split ``v`` has bit
  ``1 << v`` in ``allowed``; fanouts count admitted edges only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampling.idmap import (dedup_dense, dedup_disjoint, dedup_hash, forget, forget_disjoint, insert_seeds,
                            insert_seeds_disjoint, pow2, rehash)
from sampling.multihop import _below, _by_block, _by_id, _gather, _gather_packed, _grow, _next, _pointers, buffer_len
from sampling.prefetch import prefetch

_DOUBLE = 1.0 / 9007199254740992.0  # 2**-53
_SCAN_MAX = 48  # up to this degree a weighted pick counts the cumulative weights below its draw
_AHEAD = 8  # frontier nodes ahead whose attribute arrays the picks phase starts fetching


@njit(cache=True, nogil=True)
def cumulative_weights(indptr, weight):
    """Per CSC position, the sum of the non-negative weights of its destination's edges up to it."""
    out = np.empty(len(weight), np.float64)
    for v in range(len(indptr) - 1):
        total = 0.0
        for p in range(indptr[v], indptr[v + 1]):
            w = weight[p]
            total += w if w > 0 else 0.0  # NaN and negative weights are never drawn
            out[p] = total
    return out


@njit(cache=True, nogil=True, inline="always")
def _uniform01(s0, s1, s2, s3):
    r, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
    return np.float64(r >> np.uint64(11)) * _DOUBLE, s0, s1, s2, s3


@njit(cache=True, nogil=True, inline="always")
def _search(cum, base, count, u):
    """The first offset ``j < count`` with ``cum[base + j] > u`` (the last one if none is); branch-free
    halving (a select, not a jump: the comparisons are unpredictable); a short segment is counted
    instead (independent compares the CPU vectorises, no chain of dependent loads)."""
    if count <= _SCAN_MAX:
        below = 0
        for i in range(count):
            below += 1 if cum[base + i] <= u else 0
        return below if below < count else count - 1
    lo, n = 0, count
    while n > 1:
        half = n >> 1
        lo = lo + half if cum[base + lo + half - 1] <= u else lo  # the answer stays in [lo, lo + n)
        n -= half
    return lo


@njit(cache=True, nogil=True, inline="always")
def _weight_at(cum, base, j):
    return cum[base + j] - (cum[base + j - 1] if j > 0 else 0.0)


@njit(cache=True, nogil=True)
def _weighted(state, cum, base, count, k, replace, out, e):
    """Offsets in ``[0, count)`` drawn ∝ weight (``cum[base:base+count]`` cumulative) into ``out[e:]``;
    returns how many (every positive-weight one when ``k < 0`` or, without replacement, at most ``k``)."""
    if count == 0 or cum[base + count - 1] <= 0.0:
        return 0
    total = cum[base + count - 1]
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    m = 0
    if k < 0 or (not replace and count <= k):
        for j in range(count):
            if _weight_at(cum, base, j) > 0.0:
                out[e + m] = j
                m += 1
    elif replace:
        for m in range(k):
            u, s0, s1, s2, s3 = _uniform01(s0, s1, s2, s3)
            out[e + m] = _search(cum, base, count, u * total)
        m = k
    else:
        tries = 2 * k + 8  # successive draws; a repeat is redrawn, a few times at most
        while m < k and tries > 0:
            tries -= 1
            u, s0, s1, s2, s3 = _uniform01(s0, s1, s2, s3)
            j = _search(cum, base, count, u * total)
            fresh = True
            for i in range(e, e + m):
                if out[i] == j:
                    fresh = False
                    break
            if fresh:
                out[e + m] = j
                m += 1
        while m < k:  # exact successive draws over the weight not drawn yet
            left = total
            for i in range(e, e + m):
                left -= _weight_at(cum, base, out[i])
            if left <= total * 1e-12:
                break  # fewer than k edges have positive weight
            u, s0, s1, s2, s3 = _uniform01(s0, s1, s2, s3)
            u *= left
            pick = -1
            for j in range(count):
                w = _weight_at(cum, base, j)
                taken = False
                for i in range(e, e + m):
                    if out[i] == j:
                        taken = True
                        break
                if taken or w <= 0.0:
                    continue
                pick = j
                if u < w:
                    break
                u -= w
            if pick < 0:
                break
            out[e + m] = pick
            m += 1
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return m


@njit(cache=True, nogil=True)
def _uniform(state, count, k, replace, out, e, scratch):
    """Offsets in ``[0, count)`` drawn uniformly into ``out[e:]`` (the fast path's rules); returns how many."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    if k < 0 or (not replace and count <= k):
        m = count
        for j in range(count):
            out[e + j] = j
    elif replace:
        m = k
        for j in range(k):
            r, s0, s1, s2, s3 = _below(count, s0, s1, s2, s3)
            out[e + j] = r
    elif k <= 32 or count > 4 * k:  # Floyd's algorithm
        m = k
        for n, j in enumerate(range(count - k, count)):
            r, s0, s1, s2, s3 = _below(j + 1, s0, s1, s2, s3)
            for i in range(e, e + n):
                if out[i] == r:
                    r = j
                    break
            out[e + n] = r
    else:  # partial Fisher-Yates
        m = k
        for j in range(count):
            scratch[j] = j
        for j in range(k):
            r, s0, s1, s2, s3 = _below(count - j, s0, s1, s2, s3)
            r += j
            scratch[j], scratch[r] = scratch[r], scratch[j]
            out[e + j] = scratch[j]
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return m


@njit(cache=True, nogil=True)
def _latest(tkeys, cand, count, k, out, e):
    """The offsets of the ``k`` candidates with the largest ``tkeys`` (ties: the earlier one) into ``out[e:]``."""
    m = 0
    for c in range(count):
        t = tkeys[c]
        p = m
        while p > 0 and tkeys[out[e + p - 1]] < t:
            p -= 1
        if p >= k:
            continue
        last = m if m < k else k - 1
        for i in range(last, p, -1):
            out[e + i] = out[e + i - 1]
        out[e + p] = c
        if m < k:
            m += 1
    return m


@njit(cache=True, nogil=True)
def _candidates(indices, times, node_time, split, allowed, start, deg, limit, cand, tkeys):
    """Offsets of the edges the time limit and the split mask admit, into ``cand`` (their times into
    ``tkeys`` when temporal); returns how many."""
    c = 0
    for j in range(deg):  # branch-free: each edge is written, and kept by advancing the count
        p = start + j
        keep = True
        t = 0
        if split is not None:
            keep = ((allowed >> split[p]) & 1) == 1
        if times is not None:
            t = times[p]
            keep &= t <= limit
        if node_time is not None:
            tn = node_time[indices[p]]
            keep &= tn <= limit
            if times is None:
                t = tn  # 'last' orders by the edge time when there is one, else by the node's
        cand[c] = j
        tkeys[c] = t
        c += 1 if keep else 0
    return c


@njit(cache=True, nogil=True)
def _filtered_cum(cum, start, cand, count, wkeys):
    """Cumulative weights of the candidates (for :func:`_weighted` over them)."""
    total = 0.0
    for c in range(count):
        w = _weight_at(cum, start, cand[c])
        total += w
        wkeys[c] = total


@njit(cache=True, nogil=True, inline="always")
def _fetch_ahead(start, deg, b, cumws, times, splits):
    if deg == 0:
        return
    if cumws is not None:
        prefetch(cumws[b], start)
        prefetch(cumws[b], start + deg - 1)
    if times is not None:
        prefetch(times[b], start)
        prefetch(times[b], start + deg - 1)
    if splits is not None:
        prefetch(splits[b], start)


@njit(cache=True, nogil=True)
def _picks(state, b, starts, degs, order, bounds, k, replace, f_lo, pos, col, e, bufs,
           indices, cumws, times, node_time, limits, last, splits, allowed):
    """Phase 2 with the variants: CSC positions of each frontier node's picks (in block order)."""
    scratch, cand, tkeys, wkeys = bufs
    filtered = limits is not None or splits is not None
    for t in range(bounds[b], bounds[b + 1]):
        if t + _AHEAD < bounds[b + 1]:  # the attribute arrays are read at each node: fetch ahead
            _fetch_ahead(starts[t + _AHEAD], degs[t + _AHEAD], b, cumws, times, splits)
        deg, start = degs[t], starts[t]
        if deg == 0:
            continue
        count = deg
        if filtered:
            limit = limits[order[t]] if limits is not None else 0
            count = _candidates(indices[b], None if times is None else times[b], node_time,
                                None if splits is None else splits[b], allowed, start, deg, limit, cand, tkeys)
        if limits is not None and last and 0 <= k < count:
            m = _latest(tkeys, cand, count, k, pos, e)
        elif cumws is not None and filtered:
            _filtered_cum(cumws[b], start, cand, count, wkeys)
            m = _weighted(state, wkeys, 0, count, k, replace, pos, e)
        elif cumws is not None:
            m = _weighted(state, cumws[b], start, count, k, replace, pos, e)
        else:
            m = _uniform(state, count, k, replace, pos, e, scratch)
        for j in range(e, e + m):
            pos[j] = start + (cand[pos[j]] if filtered else pos[j])
            col[j] = f_lo + order[t]
        e += m
    return e


@njit(cache=True, nogil=True)
def _limits(batch_of, f_lo, f_hi, seed_times):
    """Each frontier node's time limit: its subgraph's seed time."""
    limits = np.empty(f_hi - f_lo, np.int64)
    for i in range(f_hi - f_lo):
        limits[i] = seed_times[batch_of[f_lo + i]]
    return limits


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
        n_nodes, valid = dedup_disjoint(table, row, col, lo, hi, nodes, batch_of, n_nodes, num_nodes)
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
def sample_variants(indptrs, indices, eids, packed, use_packed, offsets, seeds, fanouts, replace, state, seen, dense,
                    table, num_nodes, disjoint, cumws, times, node_time, seed_times, last, splits, allowed):
    """Sample every hop of one batch with the variants given (``None`` = off; see the module docstring).

    Arguments and result as :func:`sampling.multihop.sample_multihop`, plus ``num_nodes`` and
    ``disjoint``, and one more result: each node's subgraph (the position of its seed; empty when not
    disjoint). When disjoint ``seen`` must be empty. ``seed_times`` needs ``disjoint``.
    """
    num_seeds, num_blocks, hops = len(seeds), len(offsets) - 1, len(fanouts)
    cap = buffer_len(num_seeds, fanouts)
    nodes = np.empty(num_seeds + cap, np.int64)
    batch_of = np.empty(num_seeds + cap if disjoint else 0, np.int64)  # of every local node: its subgraph
    row, col, eid, pos = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
                          np.empty(cap, np.int64))
    block_edges = np.zeros((hops, num_blocks + 1), np.int64)
    nodes_per_hop = np.zeros(hops + 1, np.int64)
    edges_per_hop = np.zeros(hops, np.int64)
    if len(seen) == 0 and len(table) < 4 * num_seeds:
        table = rehash(table, pow2(4 * num_seeds))
    if disjoint:
        insert_seeds_disjoint(table, seeds, nodes, batch_of, num_nodes)
    else:
        insert_seeds(seen, dense, table, seeds, nodes)
    n_nodes, n_edges, f_lo, f_hi = num_seeds, 0, 0, num_seeds
    nodes_per_hop[0] = num_seeds
    bufs = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    for h in range(hops):
        k, nf = fanouts[h], f_hi - f_lo
        block_edges[h, :] = n_edges
        if k == 0 or nf == 0:
            f_lo = f_hi = n_nodes
            continue
        limits = _limits(batch_of, f_lo, f_hi, seed_times) if seed_times is not None else None
        if nf >= 4096 and offsets[-1] - offsets[0] < (1 << 31):
            order, bounds, sorted_ids = _by_id(offsets, nodes, f_lo, f_hi)
        else:
            order, bounds, sorted_ids = _by_block(offsets, nodes, f_lo, f_hi)
        starts, degs = np.empty(nf, np.int64), np.empty(nf, np.int64)
        _pointers(indptrs, offsets, sorted_ids, bounds, starts, degs)
        total, max_deg = 0, 0
        for t in range(nf):
            d = degs[t]
            total += d if (k < 0 or (not replace and d < k)) else (k if d > 0 else 0)
            max_deg = max(max_deg, d)
        need = n_edges + total
        if need > len(row):
            row, col, eid, pos = _grow(row, need), _grow(col, need), _grow(eid, need), _grow(pos, need)
        if n_nodes + total > len(nodes):
            nodes = _grow(nodes, n_nodes + total)
            if disjoint:
                batch_of = _grow(batch_of, n_nodes + total)
        if len(bufs[0]) < max_deg:
            bufs = (np.empty(max_deg, np.int64), np.empty(max_deg, np.int64), np.empty(max_deg, np.int64),
                    np.empty(max_deg, np.float64))
        e = n_edges
        for b in range(num_blocks):
            block_edges[h, b] = e
            e = _picks(state, b, starts, degs, order, bounds, k, replace, f_lo, pos, col, e, bufs,
                       indices, cumws, times, node_time, limits, last, splits, allowed)
        block_edges[h, num_blocks] = e
        if use_packed:
            _gather_packed(packed, block_edges[h], pos, row, eid)
        else:
            _gather(indices, eids, block_edges[h], pos, row, eid)
        n_nodes, valid, table = _relabel(seen, dense, table, row, col, n_edges, e, nodes, batch_of, n_nodes,
                                         num_nodes, disjoint)
        if not valid:
            _forget(seen, table, nodes, batch_of, n_nodes, num_nodes, disjoint)
            nodes_per_hop[0] = -1
            return (nodes[:0], row[:0], col[:0], eid[:0], pos[:0], block_edges, nodes_per_hop, edges_per_hop, table,
                    batch_of[:0])
        edges_per_hop[h] = e - n_edges
        n_edges = e
        f_lo, f_hi = f_hi, n_nodes
        nodes_per_hop[h + 1] = f_hi - f_lo
    _forget(seen, table, nodes, batch_of, n_nodes, num_nodes, disjoint)
    return (nodes[:n_nodes], row[:n_edges], col[:n_edges], eid[:n_edges], pos[:n_edges], block_edges,
            nodes_per_hop, edges_per_hop, table, batch_of[:n_nodes])
