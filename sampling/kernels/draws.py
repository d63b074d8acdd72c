"""The draws of the picks phase (numba): uniform, weighted (cumulative weights or alias tables), latest.

Each writes offsets in ``[0, count)`` into ``out[e:]`` and returns how many; the generator state is
xoshiro256** (:mod:`sampling.kernels.rng`), four words updated in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampling.kernels.rng import bounded, next_u64

_DOUBLE = 1.0 / 9007199254740992.0  # 2**-53
_SCAN_MAX = 48  # up to this many candidates a weighted pick counts the cumulative weights below its draw


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
    r, s0, s1, s2, s3 = next_u64(s0, s1, s2, s3)
    return np.float64(r >> np.uint64(11)) * _DOUBLE, s0, s1, s2, s3


@njit(cache=True, nogil=True, inline="always")
def _column(n, s0, s1, s2, s3):
    """An alias draw from one 64-bit number: a column in ``[0, n)`` from the high half (Lemire's
    multiply-shift; the rare rejection draws again) and 32 uniform bits from the low half."""
    nn = np.uint64(n)
    while True:
        r, s0, s1, s2, s3 = next_u64(s0, s1, s2, s3)
        m = (r >> np.uint64(32)) * nn
        low = m & np.uint64(0xFFFFFFFF)
        if low >= nn or low >= (np.uint64(0x100000000) - nn) % nn:  # the modulo only in the rare case
            break
    return np.int64(m >> np.uint64(32)), np.uint32(r & np.uint64(0xFFFFFFFF)), s0, s1, s2, s3


@njit(cache=True, nogil=True, inline="always")
def _search(cum, base, count, u):
    """The first offset ``j < count`` with ``cum[base + j] > u`` (the last one if none is); branch-free
    halving; a short segment is counted instead (independent compares the CPU vectorises)."""
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


@njit(cache=True, nogil=True, inline="always")
def picked_before(out, e, m, j):
    """Whether ``j`` is among the ``m`` picks ``out[e:e + m]``."""
    for i in range(e, e + m):
        if out[i] == j:
            return True
    return False


@njit(cache=True, nogil=True)
def _exact_rest(state, cum, base, count, k, out, e, m):
    """Successive draws over the weight not drawn yet, until ``k`` (or no positive weight is left)."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    total = cum[base + count - 1]
    while m < k:
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
            if w <= 0.0 or picked_before(out, e, m, j):
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
def draw_weighted(state, cum, base, count, k, replace, out, e):
    """Offsets in ``[0, count)`` drawn ∝ weight (``cum[base:base+count]`` cumulative) into ``out[e:]``;
    returns how many (every positive-weight one when ``k < 0`` or, without replacement, at most ``k``)."""
    if count == 0 or cum[base + count - 1] <= 0.0:
        return 0
    total = cum[base + count - 1]
    m = 0
    if k < 0 or (not replace and count <= k):
        for j in range(count):
            if _weight_at(cum, base, j) > 0.0:
                out[e + m] = j
                m += 1
        return m
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    tries = k if replace else 2 * k + 8  # without replacement a repeat is redrawn, a few times at most
    while m < k and tries > 0:
        tries -= 1
        u, s0, s1, s2, s3 = _uniform01(s0, s1, s2, s3)
        j = _search(cum, base, count, u * total)
        if replace or not picked_before(out, e, m, j):
            out[e + m] = j
            m += 1
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return m if replace else _exact_rest(state, cum, base, count, k, out, e, m)


@njit(cache=True, nogil=True, inline="always")
def _alias_entry(alias, astride, amask, p):
    """Position ``p``'s alias entry (see :func:`draw_weighted_alias`): ``(threshold, offset of its alias)``."""
    if amask:
        word = np.uint32(alias[astride * p])
        return word & ~np.uint32(amask), np.int64(word & np.uint32(amask))
    return np.uint32(alias[astride * p]), np.int64(alias[astride * p + 1])  # both read: no load in one arm


@njit(cache=True, nogil=True)
def _alias_rest(state, alias, astride, amask, start, count, k, out, e, m, cum):
    """After the redraws of :func:`draw_weighted_alias` ran out: successive draws over the edges not drawn yet
    (``out[e:e + m]``), each ∝ its share of the node's alias table, into ``out[e + m:]`` until ``k`` (or no
    share is left). A column's share is its threshold plus what each column aliased to it leaves (in units
    of ``2**-32`` of a column: integers, exact in float64), so these draws follow the same weights as the
    redraws, and read only the node's entries, which the redraws brought into cache (not its weights,
    elsewhere in memory). ``cum`` (scratch, ≥ ``count``) holds the cumulative shares left: a pick counts
    the sums at or below its draw, then takes its share off the sums after it (branch-free loops)."""
    sums = cum[:count]  # indexed from 0: the loops over it are contiguous vector code
    for j in range(count):
        sums[j] = 0.0
    for i in range(count):
        threshold, other = _alias_entry(alias, astride, amask, start + i)
        sums[i] += np.float64(threshold)
        sums[other] += 4294967296.0 - np.float64(threshold)
    for i in range(m):
        sums[out[e + i]] = 0.0
    left = 0.0
    for j in range(count):
        left += sums[j]
        sums[j] = left
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    while m < k and left > 0.0:
        u, s0, s1, s2, s3 = _uniform01(s0, s1, s2, s3)
        u *= left
        pick = 0
        for j in range(count):
            pick += 1 if sums[j] <= u else 0
        pick = min(pick, count - 1)  # u rounded up to ``left``: the last column with a share, below
        share = sums[pick] - (sums[pick - 1] if pick > 0 else 0.0)
        while share <= 0.0:
            pick -= 1
            share = sums[pick] - (sums[pick - 1] if pick > 0 else 0.0)
        out[e + m] = pick
        m += 1
        left -= share
        after = sums[pick:]  # from 0 again (an index from ``pick`` may be negative: wrapped per element)
        for j in range(len(after)):
            after[j] -= share
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return m


@njit(cache=True, nogil=True, inline="always")
def draw_weighted_alias(state, alias, astride, amask, cum, start, count, k, replace, out, e):
    """As :func:`draw_weighted` over a node's whole CSC segment ``[start, start + count)``, a draw being one
    read of its alias table (:func:`sampling.graph.derived.alias_table`: per position a uint32 threshold and
    the offset of its alias, at ``alias[astride * p]`` and the next: a uint32 array, ``astride`` 2, or the
    weighted packed layout, int32, 4, offset by 2). With ``amask`` (not 0) both are one word, 3 apart
    (:func:`sampling.graph.derived.compact_weighted_packed`): the offset in the ``amask`` bits, the threshold in
    the others. Repeats are found in a bit mask (up to 64 edges); after a few, :func:`_alias_rest` draws the rest
    (``cum``: its scratch)."""
    offset_bits = np.uint32(amask)
    if count == 0:
        return 0
    if amask:  # a destination without a positive weight: a zero threshold, every offset bit set
        if np.uint32(alias[astride * start]) == offset_bits:
            return 0
    elif np.int32(alias[astride * start + 1]) < 0:
        return 0
    m = 0
    if k < 0 or (not replace and count <= k):
        for j in range(count):
            if _alias_entry(alias, astride, amask, start + j)[0] != 0:  # a positive weight
                out[e + m] = j
                m += 1
        return m
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    tries = 3 * k + 16  # without replacement: redraws cost less than the rest's pass while repeats are few
    # one loop per case (no case tested per draw, and the bit mask stays in a register)
    if replace:
        drawn = out[e:e + k]
        for i in range(k):
            j, low, s0, s1, s2, s3 = _column(count, s0, s1, s2, s3)
            threshold, other = _alias_entry(alias, astride, amask, start + j)
            drawn[i] = other if low >= threshold else j  # a select: a coin flip, no jump to mispredict
        m = k
    elif count <= 64:
        drawn, taken = out[e:e + k], np.uint64(0)
        while m < k and tries > 0:  # branch-free: always written, kept by advancing the count
            tries -= 1
            j, low, s0, s1, s2, s3 = _column(count, s0, s1, s2, s3)
            threshold, other = _alias_entry(alias, astride, amask, start + j)
            j = other if low >= threshold else j
            bit = np.uint64(1) << np.uint64(j)
            drawn[m] = j
            m += 1 if (taken & bit) == 0 else 0
            taken |= bit
    else:  # a long segment: the first k draws read their entries in a loop of their own, with no branch
        drawn = out[e:e + k]  # on what they read, so their cache misses overlap (a repeat test per draw, whose
        for i in range(k):  # exit mispredicts, let one miss at a time through); then repeats are dropped in order
            j, low, s0, s1, s2, s3 = _column(count, s0, s1, s2, s3)
            threshold, other = _alias_entry(alias, astride, amask, start + j)
            drawn[i] = other if low >= threshold else j
        tries -= k
        for i in range(k):  # the same picks, in the same order, as testing each draw against those before it
            j = drawn[i]
            seen = False
            for q in range(m):  # every earlier pick compared: no exit to mispredict
                seen |= drawn[q] == j
            drawn[m] = j
            m += 0 if seen else 1
        while m < k and tries > 0:
            tries -= 1
            j, low, s0, s1, s2, s3 = _column(count, s0, s1, s2, s3)
            threshold, other = _alias_entry(alias, astride, amask, start + j)
            j = other if low >= threshold else j
            if not picked_before(out, e, m, j):
                out[e + m] = j
                m += 1
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    if m == k:
        return m
    return _alias_rest(state, alias, astride, amask, start, count, k, out, e, m, cum)


@njit(cache=True, nogil=True, inline="always")
def draw_uniform(state, count, k, replace, out, e, scratch):
    """Offsets in ``[0, count)`` drawn uniformly into ``out[e:]`` (the fast path's rules); returns how many."""
    m, state[0], state[1], state[2], state[3] = uniform_draws(state[0], state[1], state[2], state[3], count, k,
                                                              replace, out, e, scratch, 0)
    return m


@njit(cache=True, nogil=True, inline="always")
def uniform_draws(s0, s1, s2, s3, count, k, replace, out, e, scratch, base):
    """:func:`draw_uniform` on a generator state held in locals, each offset written plus ``base``: all of
    them when ``k < 0`` or, without replacement, ``count <= k``; with replacement ``k`` draws; else
    Floyd's algorithm for small ``k``, a partial Fisher-Yates shuffle over ``scratch`` (≥ ``count``)
    for large; none of none (with replacement too: ``k`` draws of nothing once wrote ``k`` copies of offset 0,
    an edge the filters had not admitted). Returns ``(how many, new state)``."""
    if k < 0 or (not replace and count <= k) or count == 0:
        m = count
        drawn = out[e:e + count]  # indexed from 0: contiguous vector stores and loads (an index that may be
        for j in range(count):  # negative is wrapped per element, which turns them into scatters and gathers)
            drawn[j] = base + j
    elif replace:
        m = k
        drawn = out[e:e + k]
        for j in range(k):
            r, s0, s1, s2, s3 = bounded(count, s0, s1, s2, s3)
            drawn[j] = base + r
    elif k <= 32 or count > 4 * k:  # Floyd's algorithm
        m = k
        drawn = out[e:e + k]
        for n, j in enumerate(range(count - k, count)):
            r, s0, s1, s2, s3 = bounded(j + 1, s0, s1, s2, s3)
            r += base
            taken = False
            for i in range(n):  # every earlier pick compared: no exit to mispredict
                taken |= drawn[i] == r
            drawn[n] = base + j if taken else r
    else:  # partial Fisher-Yates
        m = k
        for j in range(count):
            scratch[j] = j
        for j in range(k):
            r, s0, s1, s2, s3 = bounded(count - j, s0, s1, s2, s3)
            r += j
            scratch[j], scratch[r] = scratch[r], scratch[j]
            out[e + j] = base + scratch[j]
    return m, s0, s1, s2, s3


@njit(cache=True, nogil=True)
def draw_latest(tkeys, count, k, out, e):
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
