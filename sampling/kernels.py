"""Numba kernels: one hop of neighbor sampling over a CSC block, and node relabelling by hash table.

Every kernel is serial (``parallel=False``): they run inside forked DataLoader workers, where
numba's OpenMP layer crashes. Compilation is cached on disk (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

STRATEGY_UNIFORM, STRATEGY_LAST = 0, 1
_EMPTY = -1


@njit(cache=True, nogil=True)
def seed_rng(seed: int) -> None:
    """Seed numba's per-thread generator (it is separate from numpy's)."""
    np.random.seed(seed)


@njit(cache=True, nogil=True)
def _pick_uniform(count: int, k: int, replace: bool, out: np.ndarray, scratch: np.ndarray) -> int:
    """Write ``k`` positions in ``[0, count)`` to ``out`` (all if ``k < 0`` or ``k >= count`` w/o replacement)."""
    if count == 0:
        return 0
    if k < 0 or (not replace and k >= count):
        for i in range(count):
            out[i] = i
        return count
    if replace:
        for i in range(k):
            out[i] = np.random.randint(0, count)
        return k
    if count > 4 * k or len(scratch) < count:  # Floyd's algorithm: k draws, O(k^2) membership scans
        n = 0
        for j in range(count - k, count):
            t = np.random.randint(0, j + 1)
            seen = False
            for i in range(n):
                if out[i] == t:
                    seen = True
                    break
            out[n] = j if seen else t
            n += 1
        return k
    for i in range(count):  # partial Fisher-Yates over a scratch permutation
        scratch[i] = i
    for i in range(k):
        j = np.random.randint(i, count)
        scratch[i], scratch[j] = scratch[j], scratch[i]
        out[i] = scratch[i]
    return k


@njit(cache=True, nogil=True)
def _pick_weighted(weights: np.ndarray, start: int, cand: np.ndarray, count: int, k: int, replace: bool,
                   out: np.ndarray, keys: np.ndarray) -> int:
    """Pick among candidates ``cand[:count]`` (offsets from ``start``) with probability ∝ weight."""
    total = 0.0
    positive = 0
    for i in range(count):
        w = weights[start + cand[i]]
        if w > 0:
            total += w
            positive += 1
    if positive == 0:
        return 0
    if replace and k >= 0:
        for i in range(count):  # cumulative weights, then k binary searches
            w = weights[start + cand[i]]
            keys[i] = (keys[i - 1] if i > 0 else 0.0) + (w if w > 0 else 0.0)
        for j in range(k):
            u = np.random.random() * total
            out[j] = np.searchsorted(keys[:count], u, side="right")
            if out[j] >= count:
                out[j] = count - 1
        return k
    take = positive if (k < 0 or k >= positive) else k
    for i in range(count):  # Efraimidis-Spirakis: the top-k of log(u) / w
        w = weights[start + cand[i]]
        keys[i] = np.log(np.random.random() + 1e-300) / w if w > 0 else -np.inf
    order = np.argsort(-keys[:count])
    for j in range(take):
        out[j] = order[j]
    return take


@njit(cache=True, nogil=True)
def sample_block(indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray, lo: int, nodes: np.ndarray,
                 fanout: int, replace: bool, weights: np.ndarray, edge_time: np.ndarray, node_time: np.ndarray,
                 node_time_lo: int, seed_time: np.ndarray, strategy: int, split: np.ndarray, allowed: int,
                 excluded: np.ndarray, excl_mul: int, excl_mode: int):
    """Sample up to ``fanout`` in-neighbors of each node of ``nodes`` (global IDs owned by this block).

    ``weights``/``edge_time`` (per CSC position) and ``node_time`` (per global node ID minus
    ``node_time_lo``) are empty arrays when unused; ``seed_time`` holds each node's time limit
    (empty = no temporal constraint). ``split`` (per CSC position, empty = no mask) admits only edges
    whose value ``v`` has bit ``1 << v`` set in ``allowed``; ``excluded`` (sorted pair keys) removes
    edges ``s -> d`` with key ``s * excl_mul + d`` (``excl_mode`` 1), ``d * excl_mul + s`` (2) or
    either (3); mode 0 excludes nothing. The fanout counts admitted edges only. Returns
    ``(counts, neighbors, edge_ids, positions)``: per node the number sampled, then the neighbors'
    global IDs, edge IDs and CSC positions, in node order.
    """
    num = len(nodes)
    counts = np.zeros(num, np.int64)
    max_deg = 0
    total = 0
    for i in range(num):
        d = indptr[nodes[i] - lo + 1] - indptr[nodes[i] - lo]
        max_deg = max(max_deg, d)
        total += d if (fanout < 0 or (not replace and d < fanout)) else fanout
    neighbors = np.empty(total, np.int64)
    edge_ids = np.empty(total, np.int64)
    positions = np.empty(total, np.int64)
    filtered = len(seed_time) > 0 or len(weights) > 0 or len(split) > 0 or excl_mode != 0
    cand = np.empty(max_deg if filtered else 0, np.int64)
    picked = np.empty(max(max_deg, fanout if fanout > 0 else 0), np.int64)
    scratch = np.empty(max_deg if (fanout > 0 and not replace) else 0, np.int64)
    keys = np.empty(max_deg if filtered else 0, np.float64)
    n_out = 0
    for i in range(num):
        start = indptr[nodes[i] - lo]
        deg = indptr[nodes[i] - lo + 1] - start
        if filtered:
            count = _candidates(indices, start, deg, edge_time, node_time, node_time_lo, seed_time, i, cand)
            if len(split) > 0 or excl_mode != 0:
                count = _admitted(indices, start, cand, count, nodes[i], split, allowed, excluded, excl_mul, excl_mode)
            if len(seed_time) > 0 and strategy == STRATEGY_LAST and 0 <= fanout < count:
                m = _latest(indices, start, cand, count, fanout, edge_time, node_time, node_time_lo, picked, keys)
            elif len(weights) > 0:
                m = _pick_weighted(weights, start, cand, count, fanout, replace, picked, keys)
            else:
                m = _pick_uniform(count, fanout, replace, picked, scratch)
            for j in range(m):
                picked[j] = cand[picked[j]]
        else:  # the hot path: positions drawn directly, no per-neighbor work
            m = _pick_uniform(deg, fanout, replace, picked, scratch)
        for j in range(m):
            pos = start + picked[j]
            neighbors[n_out] = indices[pos]
            edge_ids[n_out] = eid[pos]
            positions[n_out] = pos
            n_out += 1
        counts[i] = m
    return counts, neighbors[:n_out], edge_ids[:n_out], positions[:n_out]


@njit(cache=True, nogil=True)
def _candidates(indices, start, deg, edge_time, node_time, node_time_lo, seed_time, i, cand) -> int:
    """Offsets of the neighbors allowed by time (all of them when not temporal)."""
    count = 0
    temporal = len(seed_time) > 0
    for j in range(deg):
        if temporal:
            if len(edge_time) > 0 and edge_time[start + j] > seed_time[i]:
                continue
            if len(node_time) > 0 and node_time[indices[start + j] - node_time_lo] > seed_time[i]:
                continue
        cand[count] = j
        count += 1
    return count


@njit(cache=True, nogil=True)
def _admitted(indices, start, cand, count, node, split, allowed, excluded, excl_mul, excl_mode) -> int:
    """Keep the candidates the split mask admits and the exclusion does not remove (in place)."""
    kept = 0
    for c in range(count):
        pos = start + cand[c]
        if len(split) > 0 and not (allowed >> split[pos]) & 1:
            continue
        if excl_mode != 0:
            s = indices[pos]
            if (excl_mode & 1) and _holds(excluded, s * excl_mul + node):
                continue
            if (excl_mode & 2) and _holds(excluded, node * excl_mul + s):
                continue
        cand[kept] = cand[c]
        kept += 1
    return kept


@njit(cache=True, nogil=True)
def _holds(keys: np.ndarray, key: np.int64) -> bool:
    i = np.searchsorted(keys, key)
    return i < len(keys) and keys[i] == key


@njit(cache=True, nogil=True)
def _latest(indices, start, cand, count, k, edge_time, node_time, node_time_lo, out, keys) -> int:
    """Temporal strategy 'last': the ``k`` candidates with the largest time."""
    for i in range(count):
        if len(edge_time) > 0:
            keys[i] = edge_time[start + cand[i]]
        else:
            keys[i] = node_time[indices[start + cand[i]] - node_time_lo]
    order = np.argsort(-keys[:count], kind="mergesort")
    for j in range(k):
        out[j] = order[j]
    return k


@njit(cache=True, nogil=True)
def _hash(key: np.int64, mask: int) -> int:
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(32)  # fold the well-mixed high bits into the low bits the mask keeps
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True)
def hash_insert(table_keys: np.ndarray, table_vals: np.ndarray, keys: np.ndarray, next_id: int):
    """Map each key to a dense local ID, assigning ``next_id, next_id + 1, ...`` to new keys.

    Returns ``(local_ids, new_keys_mask, next_id)``. The table must have room (load ≤ 1/2).
    """
    mask = len(table_keys) - 1
    out = np.empty(len(keys), np.int64)
    new = np.zeros(len(keys), np.bool_)
    for i in range(len(keys)):
        slot = _hash(keys[i], mask)
        while True:
            k = table_keys[slot]
            if k == keys[i]:
                out[i] = table_vals[slot]
                break
            if k == _EMPTY:
                table_keys[slot] = keys[i]
                table_vals[slot] = next_id
                out[i] = next_id
                new[i] = True
                next_id += 1
                break
            slot = (slot + 1) & mask
    return out, new, next_id


@njit(cache=True, nogil=True)
def _find(table_keys: np.ndarray, key: np.int64) -> int:
    """The slot holding ``key``, or -1."""
    mask = len(table_keys) - 1
    slot = _hash(key, mask)
    while table_keys[slot] != key:
        if table_keys[slot] == _EMPTY:
            return -1
        slot = (slot + 1) & mask
    return slot


@njit(cache=True, nogil=True)
def hash_clear(table_keys: np.ndarray, keys: np.ndarray) -> None:
    """Empty the table by removing ``keys`` (every key it holds, any order, repeats allowed) in
    O(len(keys)): all slots are found while the table is intact, then blanked."""
    slots = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        slots[i] = _find(table_keys, keys[i])
    for i in range(len(keys)):
        if slots[i] >= 0:
            table_keys[slots[i]] = _EMPTY


@njit(cache=True, nogil=True)
def hash_set(table_keys: np.ndarray, table_vals: np.ndarray, keys: np.ndarray, vals: np.ndarray) -> None:
    """Set the value of each (present) key."""
    for i in range(len(keys)):
        slot = _find(table_keys, keys[i])
        if slot >= 0:
            table_vals[slot] = vals[i]


@njit(cache=True, nogil=True)
def hash_rehash(table_keys: np.ndarray, table_vals: np.ndarray, capacity: int):
    """A table of ``capacity`` slots holding the same entries."""
    new_keys = np.full(capacity, _EMPTY, np.int64)
    new_vals = np.empty(capacity, np.int64)
    mask = capacity - 1
    for i in range(len(table_keys)):
        k = table_keys[i]
        if k != _EMPTY:
            slot = _hash(k, mask)
            while new_keys[slot] != _EMPTY:
                slot = (slot + 1) & mask
            new_keys[slot] = k
            new_vals[slot] = table_vals[i]
    return new_keys, new_vals
