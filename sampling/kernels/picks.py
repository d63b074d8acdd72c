"""The picks phase of the sampling engine: per frontier node, which CSC positions to take (numba).

Every per-edge decision is a compile-time variant: an option that is off is passed as ``None`` and
numba compiles one specialisation per combination with the untaken branches pruned, so no variant
pays for another, and variants combine (weighted + temporal + disjoint + masked in one call).

- uniform: the fast path's draws (Floyd's algorithm, a partial Fisher-Yates shuffle, or with
  replacement), over the node's edges or over its candidates.
- weighted: ``aliases`` (per block, Walker's alias table of each destination's edges, built once per
  block: :mod:`sampling.graph.derived`) make a pick one draw and one read; without replacement, repeats are
  redrawn (successive draws ∝ weight), after a few the rest are drawn exactly from the weight left.
  When other filters leave a subset of the edges, the subset's cumulative weights are searched.
- temporal: an edge is a candidate when its time is at or before its frontier node's limit (its
  subgraph's seed time). With ``tsort`` (each destination's edges sorted by time, their times apart
  from their sources and edge IDs, built once per block: :func:`sampling.graph.derived.time_records`) the
  cut is a search over the times, ``last`` takes the end of the prefix and picks are sorted positions;
  otherwise ``times`` (per CSC position) and/or ``node_time`` (per source node) are scanned.
- edge mask: ``splits`` (link split per CSC position) admits edges whose split ``v`` has bit ``1 << v``
  in ``allowed``; ``excl`` (sorted keys) drops the links of a link batch (``excl_mode`` 1: key
  ``src * excl_mul + dst``, 2: ``dst * excl_mul + src``, 3: either). An edge is excluded only when both its
  nodes are links' ends: ``excl_nodes`` filters those, so a node it does not hold tests none of its edges
  (mode 0), and a node it holds searches the keys only for sources it holds. Fanouts count admitted edges.
  Uniform picks under a mask alone scan a node's admitted edges, or draw by rejection when it has many edges
  per pick.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampling.kernels.draws import (draw_latest, draw_uniform, draw_weighted, draw_weighted_alias, picked_before,
                                    uniform_draws)
from sampling.graph.derived import key_at, pair_at
from sampling.graph.edgemask import FILTER_MIX
from sampling.kernels.cacheline import prefetch
from sampling.kernels.rng import bounded

# The picks kernels only read and write their callers' arrays, so they are compiled without reference
# counting (numba's ``_nrt=False``, which also holds for every function they call; an allocation there
# fails to compile, it does not leak). With it, numba increfs and decrefs the arrays an inlined draw is
# passed, once per frontier node each: atomic operations that were 7% of the plain path's time and 20% of
# the weighted one's (perf, JIT symbols from /tmp/perf-PID.map).
borrowing = njit(cache=True, nogil=True, _nrt=False)

STRATEGY_UNIFORM, STRATEGY_LAST = 0, 1  # temporal strategies (as the remote sampling requests name them)
_AHEAD = 8  # frontier nodes ahead whose attribute arrays the picks phase starts fetching
_AHEAD_CUT = 16  # frontier nodes ahead whose time-sorted keys the cut starts fetching
_AHEAD_BLOCK = 8  # frontier nodes ahead whose pairs (or blocked time records) the one-pass picks fetch
_SPARSE = 32  # edges per pick from which the masked picks draw by rejection rather than scan the node's edges
_NO_PAIRS = np.zeros(0, np.int32)  # pick_uniform without packed pairs: positions only


@njit(cache=True, nogil=True, inline="always")
def most_picks(deg, k, replace):
    """The most edges a node of ``deg`` edges can yield to ``k`` picks (every one when ``k < 0``): as many as
    :func:`~sampling.kernels.draws.uniform_draws` takes."""
    return deg if (k < 0 or (not replace and deg < k)) else (k if deg > 0 else 0)


@njit(cache=True, nogil=True, inline="always")
def _holds(keys, key):
    i = np.searchsorted(keys, key)
    return i < len(keys) and keys[i] == key


_MIX = np.uint64(FILTER_MIX)
_HIGH = np.uint64(32)


@njit(cache=True, nogil=True, inline="always")
def _may_hold(nodes, node):
    """Whether the filter ``nodes`` (:func:`sampling.graph.edgemask.node_filter`, whose arithmetic this
    repeats) may hold ``node``: false means it does not."""
    bit = (((np.uint64(node) * _MIX) >> _HIGH) * np.uint64(64 * len(nodes))) >> _HIGH
    return (nodes[bit >> np.uint64(6)] >> (bit & np.uint64(63))) & np.uint64(1) != 0


@njit(cache=True, nogil=True, inline="always")
def _node_mode(excl, nodes, excl_mode, dst):
    """``excl_mode`` for a node the filter of the links' ends may hold, else 0: an edge into a node that is no
    link's end is never excluded."""
    if excl is None:
        return 0
    return excl_mode if _may_hold(nodes, dst) else 0


@njit(cache=True, nogil=True, inline="always")
def _admits(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, p, dst):
    """Whether the split mask admits the edge at CSC position ``p`` into ``dst`` and the exclusion keeps it
    (tested when its source is a link's end as far as the filter ``excl_nodes`` knows)."""
    keep = True
    if split is not None:
        keep = ((allowed >> split[p]) & 1) == 1
    if excl is not None and keep and excl_mode != 0:
        s = np.int64(src[stride * p])
        if not _may_hold(excl_nodes, s):
            return keep
        if (excl_mode & 1) and _holds(excl, s * excl_mul + dst):
            keep = False
        if (excl_mode & 2) and _holds(excl, dst * excl_mul + s):
            keep = False
    return keep


@njit(cache=True, nogil=True)
def _candidates(src, stride, times, node_time, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start, deg, limit,
                dst, cand, tkeys):
    """Offsets of the edges the time limit, the split mask and the exclusion admit, into ``cand`` (their
    times into ``tkeys`` when temporal); ``src[stride * p]`` is the source of CSC position ``p``."""
    c = 0
    for j in range(deg):  # branch-free where it can be: each edge is written, kept by advancing the count
        p = start + j
        keep = True
        t = 0
        if times is not None:
            t = times[p]
            keep = t <= limit
        if node_time is not None:
            tn = node_time[src[stride * p]]
            keep &= tn <= limit
            if times is None:
                t = tn  # 'last' orders by the edge time when there is one, else by the node's
        if split is not None or excl is not None:
            keep &= _admits(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, p, dst)
        cand[c] = j
        tkeys[c] = t
        c += 1 if keep else 0
    return c


@njit(cache=True, nogil=True)
def _filtered_cum(weight, start, cand, count, wkeys):
    """Cumulative weights of the candidates (for :func:`draw_weighted` over them)."""
    total = 0.0
    for c in range(count):
        w = weight[start + cand[c]]
        total += w if w > 0 else 0.0
        wkeys[c] = total


@njit(cache=True, nogil=True, inline="always")
def _node_outputs(out, e, m):
    """A node's ``m`` outputs from ``e`` (``pos``, ``col``, ``row``, ``eid`` of the
    :class:`~sampling.kernels.structs.Edges` ``out``) as slices indexed from 0: numba wraps an index that may
    be negative (``pos[e + j]``) per element, which made the vectorised loops over them scatters and gathers."""
    return out.pos[e:e + m], out.col[e:e + m], out.row[e:e + m], out.eid[e:e + m]


@njit(cache=True, nogil=True, inline="always")
def _fetch_ahead(start, deg, b, weights, aliases, astride, times, splits):
    if deg == 0:
        return
    if aliases is not None:  # draws land anywhere in the segment: fetch its lines (up to 64 entries)
        first, end = astride * start, astride * (start + min(deg, 64))  # 32-bit words, 16 a line
        for w in range(first - first % 16, end, 16):
            prefetch(aliases[b], w)
    elif weights is not None:
        prefetch(weights[b], start)
    if times is not None:
        prefetch(times[b], start)
        prefetch(times[b], start + deg - 1)
    if splits is not None:
        prefetch(splits[b], start)


@njit(cache=True, nogil=True, inline="always")
def _at(arrays, b):
    """Block ``b``'s array of a per-block tuple, or ``None`` when the variant is off."""
    if arrays is None:
        return None
    return arrays[b]


@borrowing
def _choose_uniform(state, count, k, replace, latest, tkeys_buf, scratch, pos, e):
    """Draw uniformly among ``count`` candidates (or the latest ``k``) into ``pos[e:]``; returns how many.

    Called, not inlined: its callers filter each node's edges first (masks, exclusions, scanned times), which
    costs far more than the call, and the inlined draws were most of each of their specialisations' compile
    (the weighted draws, the hot path of their variant, stay inlined)."""
    if latest and 0 <= k < count:
        return draw_latest(tkeys_buf, count, k, pos, e)
    return draw_uniform(state, count, k, replace, pos, e, scratch)


@njit(cache=True, nogil=True, inline="always")
def _choose_alias(state, count, k, replace, latest, filtered, start, tkeys_buf, alias, astride, amask, wkeys, pos,
                  e):
    """Draw by weight: from the node's alias table when no filter left a subset, else over the subset's
    cumulative weights ``wkeys`` (or the latest ``k``); returns how many."""
    if latest and 0 <= k < count:
        return draw_latest(tkeys_buf, count, k, pos, e)
    if not filtered:
        return draw_weighted_alias(state, alias, astride, amask, wkeys, start, count, k, replace, pos, e)
    return draw_weighted(state, wkeys, 0, count, k, replace, pos, e)


@njit(cache=True, nogil=True, inline="always")
def _choose_weighted(state, count, k, replace, latest, tkeys_buf, wkeys, pos, e):
    """Draw by the cumulative weights ``wkeys`` of ``count`` candidates (or the latest ``k``); returns how many."""
    if latest and 0 <= k < count:
        return draw_latest(tkeys_buf, count, k, pos, e)
    return draw_weighted(state, wkeys, 0, count, k, replace, pos, e)


@njit(cache=True, nogil=True, inline="always")
def pick_block(state, b, t_lo, t_hi, fr, hop, var, out, e, bufs, ends, gathered):
    """The picks of frontier nodes ``t_lo:t_hi`` of block ``b`` (within ``fr.bounds[b]:fr.bounds[b + 1]``, a
    :class:`~sampling.kernels.structs.Frontier`) under the variants ``var``
    (:class:`~sampling.kernels.structs.VariantArrays`): their CSC positions into ``out.pos[e:]`` and their
    frontier positions ``hop.lo + fr.order[t]`` into ``out.col[e:]``; returns the end. With time-sorted
    edges (``var.tsort``) the positions are the sorted ones: :func:`_pick_sorted`. ``gathered``: the picks
    read their node's lines (alias entries beside the packed pairs), so the sources and edge IDs are read
    from there at once, into ``out.row``/``out.eid``. ``ends``: per frontier position, room for each node's
    end over blocked time records with weights or filters (else empty): these kernels allocate nothing.

    Inlined: it hands the variants that may be off to :func:`_picks_of` as arguments, where numba prunes
    the branches of those that are (it does not prune on a record's fields)."""
    return _picks_of(state, b, t_lo, t_hi, fr, hop, var, out, e, bufs, ends, gathered, var.weights, var.aliases,
                     var.times, var.tsort, var.node_time, hop.limits, var.splits, var.excl, var.msort)


@borrowing
def _picks_of(state, b, t_lo, t_hi, fr, hop, var, out, e, bufs, ends, gathered, weights, aliases, times, tsort,
              node_time, limits, splits, excl, msort):
    """:func:`pick_block` with the variants that may be off (``None``) as arguments."""
    if tsort is not None:
        return _pick_sorted(state, fr, t_lo, t_hi, hop, out, e, bufs, ends, var.src[b], var.stride, _at(weights, b),
                            _at(splits, b), var.allowed, excl, var.excl_mul, var.excl_mode, var.excl_nodes, var.last,
                            tsort.keys[b], tsort.order[b], tsort.base[b], tsort.latest[b], tsort.blocked[b] != 0)
    if weights is None and limits is None and splits is None and excl is None:  # every variant off
        if var.stride == 2:  # over the packed pairs the picks read them too
            return pick_uniform(state, fr, t_lo, t_hi, hop.k, hop.replace, hop.lo, out, e, bufs.draws, var.src[b])
        return pick_uniform(state, fr, t_lo, t_hi, hop.k, hop.replace, hop.lo, out, e, bufs.draws, _NO_PAIRS)
    if weights is None:
        if limits is None:  # uniform picks under a mask or an exclusion alone
            if msort is not None:  # the mask's admitted edges first (built only under a mask): plain picks of a prefix
                return _pick_prefix(state, fr, t_lo, t_hi, hop.k, hop.replace, hop.lo, out, e, bufs.draws, bufs.cand,
                                    msort.pairs[b], msort.counts[b], msort.lo[b], excl, var.excl_mul, var.excl_mode,
                                    var.excl_nodes)
            return _pick_masked(state, fr, t_lo, t_hi, hop.k, hop.replace, hop.lo, out, e, bufs.draws, bufs.cand,
                               var.src[b], var.stride, splits, b, var.allowed, excl, var.excl_mul, var.excl_mode,
                               var.excl_nodes, gathered)
    starts, degs, order, ids = fr.starts, fr.degs, fr.order, fr.ids
    k, replace, f_lo, stride, astride, amask = hop.k, hop.replace, hop.lo, var.stride, var.astride, var.amask
    allowed, excl_mul, excl_mode, excl_nodes = var.allowed, var.excl_mul, var.excl_mode, var.excl_nodes
    scratch, cand, tkeys_buf, wkeys = bufs
    pos = out.pos
    filtered = limits is not None or splits is not None or excl is not None
    latest = var.last and limits is not None
    src_b, split_b, times_b = var.src[b], _at(splits, b), _at(times, b)
    weight_b, alias_b = _at(weights, b), _at(aliases, b)
    for t in range(t_lo, t_hi):
        if t + _AHEAD < t_hi:  # the attribute arrays are read at each node: fetch ahead
            _fetch_ahead(starts[t + _AHEAD], degs[t + _AHEAD], b, weights, aliases, astride, times, splits)
        deg, start = degs[t], starts[t]
        if deg == 0:
            continue
        count = deg
        if filtered:
            limit = limits[order[t]] if limits is not None else 0
            count = _candidates(src_b, stride, times_b, node_time, split_b, allowed, excl, excl_mul,
                                _node_mode(excl, excl_nodes, excl_mode, ids[t]), excl_nodes, start, deg, limit, ids[t],
                                cand, tkeys_buf)
        if weight_b is not None:
            if filtered or alias_b is None:  # else the alias table draws: no cumulative weights
                _weights_of(weight_b, filtered, start, cand, count, wkeys)
        # one draw per variant, chosen by branches on this function's own arguments: numba prunes those of the
        # variants that are off before it inlines the draws, so a specialisation compiles only its own
        if weights is None:
            m = _choose_uniform(state, count, k, replace, latest, tkeys_buf, scratch, pos, e)
        elif aliases is None:
            m = _choose_weighted(state, count, k, replace, latest, tkeys_buf, wkeys, pos, e)
        else:
            m = _choose_alias(state, count, k, replace, latest, filtered, start, tkeys_buf, alias_b, astride, amask,
                              wkeys, pos, e)
        picked, cols, rows, eids = _node_outputs(out, e, m)
        for j in range(m):
            picked[j] = start + (cand[picked[j]] if filtered else picked[j])
            cols[j] = f_lo + order[t]
            if gathered:
                rows[j], eids[j] = src_b[stride * picked[j]], src_b[stride * picked[j] + 1]
        e += m
    return e


@borrowing
def pick_uniform(state, fr, t_lo, t_hi, k, replace, f_lo, out, e, scratch, packed):
    """:func:`pick_block` with every variant off (the plain path), for the frontier nodes ``t`` in
    ``[t_lo, t_hi)`` of ``fr``: ``k`` CSC positions of each node's edges
    (:func:`sampling.kernels.draws.uniform_draws`: all of them when ``k < 0`` or, without replacement,
    ``deg <= k``; ``scratch`` ≥ the largest degree), the generator state in locals. With the ``packed``
    (source, edge ID) pairs (not empty) each node is one pass: its pairs fetched ahead, the draws, and
    the picked pairs read into ``out.row``/``out.eid`` (no phase 3); else positions only. It takes no
    :class:`~sampling.kernels.structs.Hop` (whose limits would make one specialisation per variant)."""
    starts, degs, order, pos = fr.starts, fr.degs, fr.order, out.pos
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    reads = len(packed) > 0
    for t in range(t_lo, t_hi):
        if reads and t + _AHEAD_BLOCK < t_hi:
            _fetch_lines(packed, 2 * starts[t + _AHEAD_BLOCK], 2 * degs[t + _AHEAD_BLOCK])  # its pairs
        deg, start, dst = degs[t], starts[t], f_lo + order[t]
        if deg == 0:
            continue
        m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, deg, k, replace, pos, e, scratch, start)
        picked, cols, rows, eids = _node_outputs(out, e, m)
        for j in range(m):
            cols[j] = dst
            if reads:
                rows[j], eids[j] = packed[2 * picked[j]], packed[2 * picked[j] + 1]
        e += m
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return e


@borrowing
def _pick_masked(state, fr, t_lo, t_hi, k, replace, f_lo, out, e, scratch, cand, src, stride, splits, b, allowed, excl,
                excl_mul, excl_mode, excl_nodes, gathered):
    """:func:`pick_block` for uniform picks among block ``b``'s edges a split mask (``splits``) and/or an
    exclusion (``excl``) admit, without weights or time limits, each node in one pass (its split bytes and pairs
    fetched ahead, its pairs read with its picks when ``gathered``: ``src`` holds the (source, edge ID) pairs,
    ``stride`` 2). A node with many edges per pick (``deg >= _SPARSE * k``) draws by rejection
    (:func:`_sparse_draws`): a uniform offset into its edges, kept when the filters admit it and it was not drawn
    before (without replacement), so each pick is uniform among the admitted edges not drawn yet, and a hub costs
    about ``k`` reads, not a pass over its edges. When ``_tries(k)`` draws find fewer than ``k`` (few edges
    admitted), the node is drawn again over a scan of its admitted edges with fresh draws: uniform either way,
    since whether the first attempt succeeds does not depend on the second's draws. Other nodes scan (all their
    admitted edges when ``k < 0`` or, without replacement, at most ``k`` admitted). With an exclusion (the few
    links of a link batch) a node's draw over what the mask admits is kept whole when none of its picks is
    excluded, uniform over the rest by the same argument, and made again over a full scan otherwise: each node
    tests ``k`` picks against the exclusion, not its every edge (two binary searches each), and only a node the
    filter ``excl_nodes`` holds (a link's end, or a rare false positive) tests any: the others' draws are the
    same, since none of their edges is excluded."""
    starts, degs, order, ids, pos = fr.starts, fr.degs, fr.order, fr.ids, out.pos
    split = _at(splits, b)
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for t in range(t_lo, t_hi):
        if t + _AHEAD_BLOCK < t_hi:
            ahead = starts[t + _AHEAD_BLOCK]
            if splits is not None:  # its split bytes, read at random offsets when it draws by rejection
                _fetch_bytes(splits[b], ahead, degs[t + _AHEAD_BLOCK])
            if gathered:
                _fetch_lines(src, stride * ahead, stride * degs[t + _AHEAD_BLOCK])
        deg, start, dst = degs[t], starts[t], ids[t]
        if deg == 0:
            continue
        mode = _node_mode(excl, excl_nodes, excl_mode, dst)
        m = -1
        if k > 0 and deg >= _SPARSE * k and deg >= _tries(k):
            m, s0, s1, s2, s3 = _sparse_draws(s0, s1, s2, s3, src, stride, split, allowed, excl, excl_mul, mode,
                                              excl_nodes, start, deg, dst, k, replace, pos, e, cand)
        direct = m >= 0
        if excl is not None and not direct and k > 0:  # the exclusion tested on the picks alone (see above)
            direct = split is None
            count = deg if direct else _scan(src, stride, split, allowed, None, excl_mul, mode, excl_nodes, start, deg,
                                             dst, cand)
            if replace or count > k or mode == 0:
                m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, count, k, replace, pos, e, scratch, 0)
                kept = True
                for j in range(m if mode != 0 else 0):
                    p = start + (pos[e + j] if direct else cand[pos[e + j]])
                    kept &= _admits(src, stride, None, allowed, excl, excl_mul, mode, excl_nodes, p, dst)
                if not kept:
                    m, direct = -1, False
            else:
                m, direct = -1, False
        if m < 0:
            count = _scan(src, stride, split, allowed, excl, excl_mul, mode, excl_nodes, start, deg, dst, cand)
            m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, count, k, replace, pos, e, scratch, 0)
        picked, cols, rows, eids = _node_outputs(out, e, m)
        col = f_lo + order[t]
        for j in range(m):
            p = start + (picked[j] if direct else cand[picked[j]])
            picked[j] = p
            cols[j] = col
            if gathered:
                rows[j], eids[j] = src[stride * p], src[stride * p + 1]
        e += m
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return e


@borrowing
def _pick_prefix(state, fr, t_lo, t_hi, k, replace, f_lo, out, e, scratch, cand, pairs, counts, lo, excl, excl_mul,
                 excl_mode, excl_nodes):
    """:func:`pick_block` for uniform picks under a split mask (and a link batch's exclusion) over records that
    hold each destination's admitted edges first (:func:`sampling.graph.derived.split_records`: ``pairs`` in that
    order, ``counts`` per destination from ``lo``): the plain picks over each node's prefix, no edge's split read.
    Positions are sorted ones (:meth:`sampling.graph.kernel_args.BlockArgs.csc_positions` translates them), and
    each pick's pair is read here. A node the filter of the links' ends holds tests its picks against the
    exclusion: kept whole when none is excluded, else drawn again over a scan of its prefix without the excluded
    ones, uniform either way (:func:`_pick_masked` says why). The draws are those of the scan over CSC order
    (the prefix keeps that order); the scan's rejection draws for hubs are not needed, since no edge is scanned."""
    starts, degs, order, ids, pos = fr.starts, fr.degs, fr.order, fr.ids, out.pos
    for t in range(t_lo, t_hi):  # each node's admitted count: reads in ID order within a block, not at random
        degs[t] = counts[ids[t] - lo]
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for t in range(t_lo, t_hi):
        if t + _AHEAD_BLOCK < t_hi:
            _fetch_lines(pairs, 2 * starts[t + _AHEAD_BLOCK], 2 * degs[t + _AHEAD_BLOCK])
        count, start, dst = degs[t], starts[t], ids[t]
        if count == 0:
            continue
        m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, count, k, replace, pos, e, scratch, start)
        mode = _node_mode(excl, excl_nodes, excl_mode, dst)
        if mode != 0:
            kept = True
            for j in range(m):
                kept &= _admits(pairs, 2, None, 0, excl, excl_mul, mode, excl_nodes, pos[e + j], dst)
            if not kept:
                c = _scan(pairs, 2, None, 0, excl, excl_mul, mode, excl_nodes, start, count, dst, cand)
                m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, c, k, replace, pos, e, scratch, 0)
                for j in range(m):
                    pos[e + j] = start + cand[pos[e + j]]
        picked, cols, rows, eids = _node_outputs(out, e, m)
        col = f_lo + order[t]
        for j in range(m):
            cols[j] = col
            rows[j], eids[j] = pairs[2 * picked[j]], pairs[2 * picked[j] + 1]
        e += m
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return e


@njit(cache=True, nogil=True, inline="always")
def _scan(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start, deg, dst, cand):
    """The offsets of a node's edges the mask and the exclusion admit, into ``cand``; returns how many."""
    count = 0
    for j in range(deg):  # branch-free: each offset written, kept by advancing the count
        cand[count] = j
        count += 1 if _admits(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start + j, dst) else 0
    return count


@njit(cache=True, nogil=True, inline="always")
def _sparse_draws(s0, s1, s2, s3, src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start, deg, dst,
                  k, replace, pos, e, drawn):
    """:func:`_pick_masked`'s rejection draws for one node: ``k`` offsets into ``pos[e:]``, or ``-1`` when
    ``_tries(k)`` draws found fewer. In rounds: each draws a few more offsets than picks are missing and
    reads whether the filters admit them in a loop with no branch on what it reads (into ``drawn``, ``-1``
    when not admitted), so their cache misses overlap; then keeps them in order, repeats dropped (without
    replacement), up to ``k``."""
    m, tries = 0, _tries(k)
    while m < k and tries > 0:
        n = min(tries, (k - m) + (k - m) // 2 + 2)  # missing picks and a half: most nodes need one round
        tries -= n
        for i in range(n):
            r, s0, s1, s2, s3 = bounded(deg, s0, s1, s2, s3)
            kept = _admits(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start + r, dst)
            drawn[i] = r if kept else -1
        for i in range(n):
            r = drawn[i]
            if m < k:  # written always, kept by advancing the count (never past the node's k places)
                pos[e + m] = r
                m += 1 if r >= 0 and (replace or not picked_before(pos, e, m, r)) else 0
    return (m if m == k else -1), s0, s1, s2, s3


@njit(cache=True, nogil=True, inline="always")
def _tries(k):
    """How many rejection draws :func:`_pick_masked` makes for ``k`` picks before it scans instead."""
    return 2 * k + 16


@njit(cache=True, nogil=True, inline="always")
def _fetch_bytes(values, first, count):
    """Start fetching the cache lines of the int8 ``values[first:first + count]`` (at most 8 lines)."""
    for w in range(first - first % 64, first + min(count, 512), 64):
        prefetch(values, w)


@njit(cache=True, nogil=True, inline="always")
def _fetch_lines(values, first, count):
    """Start fetching the cache lines of the int32 ``values[first:first + count]`` (at most 8 lines)."""
    for w in range(first - first % 16, first + min(count, 128), 16):
        prefetch(values, w)


@njit(cache=True, nogil=True, inline="always")
def _fetch_records(records, start, deg, key, latest):
    """Start fetching the lines of blocked time records (:func:`sampling.graph.derived.time_records`) that a
    node whose edges start at ``start`` will read under the limit ``key``: with every edge eligible (``key`` at
    or after ``latest``) no key is read, so its pairs; else its keys and the first half of its pairs, where the
    earliest edges are (an estimate of its cut from the limit fetched more lines than it saved, ``spread`` seed
    times in ``tools/bench_variants.py``)."""
    if key >= latest:
        _fetch_lines(records, pair_at(start, start + deg), 2 * deg)
    else:
        _fetch_lines(records, key_at(start, True), 2 * deg)
        if deg > 32:  # the line of the cut's first probe
            prefetch(records, key_at(start, True) + _guess(deg, key, latest))


@njit(cache=True, nogil=True, inline="always")
def _cut(keys, start, deg, key, latest):
    """How many of the time-sorted ``keys[start:start + deg]`` (at most ``latest``) are at or before ``key``
    (``start``: where the node's keys begin, :func:`sampling.graph.derived.key_at`): counted over a short
    segment (independent compares, no branch to mispredict); over a long one searched from where the key would
    be were the times spread evenly up to ``latest`` (:func:`_guess`, whose line is fetched ahead), widening
    by doubling steps to a bracket, then halved branch-free within it. A hub's search reads a line or two
    near its guess, not one line per halving; uneven times cost at most twice the halvings."""
    if deg <= 32:
        lo = 0
        segment = keys[start:start + deg]  # indices from 0: contiguous loads, no wraparound per key
        for j in range(deg):
            lo += 1 if segment[j] <= key else 0
        return lo
    g = _guess(deg, key, latest)
    step = 16  # keys per line at 32 bits
    if keys[start + g] <= key:  # the answer is above g: keys[lo - 1] <= key
        lo = g + 1
        while lo + step <= deg and keys[start + lo + step - 1] <= key:
            lo += step
            step *= 2
        n = min(step, deg - lo)
    else:  # at or below g: keys[hi] > key
        hi = g
        while hi >= step and keys[start + hi - step] > key:
            hi -= step
            step *= 2
        lo = max(hi - step, 0)
        n = hi - lo
    if n == 0:
        return lo
    while n > 1:  # the answer stays in [lo, lo + n]
        half = n >> 1
        lo = lo + half if keys[start + lo + half] <= key else lo
        n -= half
    return lo + (1 if keys[start + lo] <= key else 0)


@njit(cache=True, nogil=True, inline="always")
def _guess(deg, key, latest):
    """Where in a node's ``deg`` time-sorted keys ``key`` would fall were they spread evenly over
    ``[0, latest]`` (``0 <= key < latest``): :func:`_cut`'s first probe."""
    return min((deg * max(key, 0)) // max(latest, 1), deg - 1)


@njit(cache=True, nogil=True)
def _cuts(keys, starts, degs, order, limits, base, latest, t_lo, t_hi, blocked):
    """Each node's count of edges at or before its limit, over its degree in ``degs``: a loop of its own
    (its reads overlap, as the picks' branches would not let them). A limit at or after the block's
    ``latest`` key keeps every edge without reading any (sampling at the present time costs no cut).
    ``blocked``: the keys are laid out blocked (:func:`sampling.graph.derived.time_records`)."""
    words = 64 // keys.itemsize  # keys per cache line
    for t in range(t_lo, t_hi):
        if t + _AHEAD_CUT < t_hi and limits[order[t + _AHEAD_CUT]] - base < latest:  # fetch its keys' lines
            first, deg = key_at(starts[t + _AHEAD_CUT], blocked), degs[t + _AHEAD_CUT]
            end = first + min(deg, 4 * words)
            for w in range(first - first % words, end, words):
                prefetch(keys, w)
            if deg > 32:  # the line of the cut's first probe
                prefetch(keys, first + _guess(deg, limits[order[t + _AHEAD_CUT]] - base, latest))
        key = limits[order[t]] - base
        if key < latest:
            degs[t] = _cut(keys, key_at(starts[t], blocked), degs[t], key, latest)


@njit(cache=True, nogil=True)
def _admitted(csc, src, stride, weight, split, allowed, excl, excl_mul, excl_mode, excl_nodes, start, cut, dst, cand,
              wkeys):
    """Of the first ``cut`` time-sorted positions from ``start``, the offsets the mask and the exclusion
    admit, into ``cand`` (and their cumulative weights into ``wkeys``); returns how many. ``csc`` maps a
    sorted position to the CSC position the mask, the source IDs and the weights are read at."""
    count = 0
    total = 0.0
    for c in range(cut):
        keep = True
        if split is not None or excl is not None:
            keep = _admits(src, stride, split, allowed, excl, excl_mul, excl_mode, excl_nodes, csc[start + c], dst)
        if weight is not None:
            w = weight[csc[start + c]]
            total += w if (keep and w > 0) else 0.0
            wkeys[count] = total
        cand[count] = c
        count += 1 if keep else 0
    return count


@borrowing
def _pick_sorted(state, fr, t_lo, t_hi, hop, out, e, bufs, ends, src, stride, weight, split, allowed, excl, excl_mul,
                 excl_mode, excl_nodes, last, keys, csc, base, latest, blocked):
    """:func:`pick_block` over time-sorted edges (``keys``: time less ``base`` per position, at most
    ``latest``; ``csc``: each one's CSC position): the cut is a search over the keys, ``last`` takes the
    end of the prefix, and the positions written are the sorted ones. Over ``blocked`` records each pick's
    pair is read here too, into ``out.row``/``out.eid`` (without weights or filters in one pass per node:
    :func:`_pick_blocked`); over records apart phase 3 reads them. Block ``b``'s arrays, not the records of
    every block: one specialisation serves any number of blocks."""
    starts, degs, order, ids = fr.starts, fr.degs, fr.order, fr.ids
    k, replace, f_lo, limits, pos = hop.k, hop.replace, hop.lo, hop.limits, out.pos
    scratch, cand, _, wkeys = bufs
    indirect = weight is not None or split is not None or excl is not None
    if blocked and not indirect:  # cut, picks and pairs in one pass over each node's block
        if stride == 2 and not last:  # over the CSC pairs where every edge is eligible
            return _pick_blocked(state, keys, fr, t_lo, t_hi, hop, last, base, latest, out, e, scratch, src)
        return _pick_blocked(state, keys, fr, t_lo, t_hi, hop, last, base, latest, out, e, scratch, _NO_PAIRS)
    for t in range(t_lo, t_hi if blocked else t_lo):  # each node's end (its pairs' place in the block) before the cut
        ends[t] = starts[t] + degs[t]
    _cuts(keys, starts, degs, order, limits, base, latest, t_lo, t_hi, blocked)
    if not indirect and not last:  # uniform over each node's prefix (apart records): the plain picks
        end = pick_uniform(state, fr, t_lo, t_hi, k, replace, f_lo, out, e, scratch, _NO_PAIRS)
        _csc_where_eligible(pos, e, starts, degs, order, limits, base, latest, t_lo, t_hi, k, replace)
        return end
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for t in range(t_lo, t_hi):
        count, start, dst = degs[t], starts[t], f_lo + order[t]
        if count == 0:
            continue
        if indirect:  # a subset of the prefix: draws are offsets into ``cand``
            count = _admitted(csc, src, stride, weight, split, allowed, excl, excl_mul,
                              _node_mode(excl, excl_nodes, excl_mode, ids[t]), excl_nodes, start, count, ids[t], cand,
                              wkeys)
        first = 0 if indirect else start
        if last and 0 <= k < count:  # time order: the latest are the last k
            latest_k = pos[e:e + k]
            for j in range(k):
                latest_k[j] = first + count - k + j
            m = k
        elif weight is not None:
            state[0], state[1], state[2], state[3] = s0, s1, s2, s3
            m = draw_weighted(state, wkeys, 0, count, k, replace, pos, e)
            s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
        else:
            m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, count, k, replace, pos, e, scratch, first)
        picked, cols, rows, eids = _node_outputs(out, e, m)
        for j in range(m):
            if indirect:
                picked[j] = start + cand[picked[j]]
            cols[j] = dst
            if blocked:
                at = pair_at(picked[j], ends[t])
                rows[j], eids[j] = keys[at], keys[at + 1]
        e += m
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return e


@borrowing
def _pick_blocked(state, records, fr, t_lo, t_hi, hop, last, base, latest, out, e, scratch, packed):
    """Picks over blocked time records (uniform, or ``last``: the end of the prefix), each node in one pass:
    its lines fetched ahead, the cut, the picks, and their pairs read into ``out.row``/``out.eid`` (no phase
    3), rather than the cut, picks and gather as three passes over the frontier (faster: the
    ``temporal-uniform`` rows of ``tools/bench_variants.py``).

    With the CSC ``packed`` pairs (uniform picks; else empty), a node whose limit is at or after the block's
    latest time (every edge eligible) takes the plain picks over its CSC pairs instead: the same draws over 8
    bytes an edge rather than 12, so it samples what disjoint sampling does. Its positions are CSC ones,
    written complemented (``~p``, negative): :func:`sampling.kernels.hop_kernel.variants_csc` keeps them."""
    starts, degs, order, limits, k, replace, f_lo = fr.starts, fr.degs, fr.order, hop.limits, hop.k, hop.replace, hop.lo
    pos = out.pos
    csc = len(packed) > 0
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for t in range(t_lo, t_hi):
        if t + _AHEAD_BLOCK < t_hi:
            ahead = limits[order[t + _AHEAD_BLOCK]] - base
            if csc and ahead >= latest:
                _fetch_lines(packed, 2 * starts[t + _AHEAD_BLOCK], 2 * degs[t + _AHEAD_BLOCK])
            else:
                _fetch_records(records, starts[t + _AHEAD_BLOCK], degs[t + _AHEAD_BLOCK], ahead, latest)
        start, deg = starts[t], degs[t]
        key = limits[order[t]] - base
        if csc and key >= latest:  # every edge eligible: the plain picks, over the CSC pairs
            if deg == 0:
                continue
            m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, deg, k, replace, pos, e, scratch, start)
            dst = f_lo + order[t]
            picked, cols, rows, eids = _node_outputs(out, e, m)
            for j in range(m):
                cols[j] = dst
                rows[j], eids[j] = packed[2 * picked[j]], packed[2 * picked[j] + 1]
                picked[j] = ~picked[j]  # a CSC position, kept as it is by variants_csc
            e += m
            continue
        count = _cut(records, key_at(start, True), deg, key, latest) if key < latest else deg
        if count == 0:
            continue
        if last and 0 <= k < count:  # time order: the latest are the last k
            m = k
            latest_k = pos[e:e + k]
            for j in range(k):
                latest_k[j] = start + count - k + j
        else:
            m, s0, s1, s2, s3 = uniform_draws(s0, s1, s2, s3, count, k, replace, pos, e, scratch, start)
        dst, end = f_lo + order[t], start + deg
        picked, cols, rows, eids = _node_outputs(out, e, m)
        for j in range(m):
            cols[j] = dst
            at = pair_at(picked[j], end)
            rows[j], eids[j] = records[at], records[at + 1]
        e += m
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return e


@borrowing
def _csc_where_eligible(pos, e, starts, degs, order, limits, base, latest, t_lo, t_hi, k, replace):
    """After the plain picks over apart time records (positions from ``e``, node after node): the picks of a node
    whose limit is at or after ``latest`` (every edge eligible) complemented into CSC positions (``~p``), as
    :func:`_pick_blocked` draws them over the packed pairs, so both layouts sample the same edges."""
    x = e
    for t in range(t_lo, t_hi):
        m = most_picks(degs[t], k, replace)
        if limits[order[t]] - base >= latest:
            for j in range(x, x + m):
                pos[j] = ~pos[j]
        x += m


@njit(cache=True, nogil=True)
def _weights_of(weight, filtered, start, cand, count, wkeys):
    """The cumulative weights a weighted pick searches (of the candidates, or of the whole segment when
    there is no alias table: the caller asks only then), into ``wkeys``."""
    if filtered:
        _filtered_cum(weight, start, cand, count, wkeys)
    else:
        total = 0.0
        for j in range(count):
            w = weight[start + j]
            total += w if w > 0 else 0.0
            wkeys[j] = total
