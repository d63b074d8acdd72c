"""Global-to-local node ID maps for one sampled batch (numba), emptied again after each batch.

Up to ``DENSE_MAX_NODES`` nodes: a one-bit-per-node "seen" map (small enough for L2) plus an int32
local ID per node, valid only where the bit is set, so a lookup of a new node never reads the large
array and only the bits need resetting. Larger graphs: an open-addressing hash of interleaved
(key, value) int64 pairs, one cache line per probe. Both fetch ahead the entries of upcoming IDs.
Disjoint batches key that hash by (subgraph, node): each subgraph holds its own copy of a node.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampling.kernels.cacheline import prefetch_write

DENSE_MAX_NODES = 1 << 24  # up to this many nodes the de-duplication map is a dense int32 array (64 MiB)
# the per-hop driver (a rank's share of a partitioned graph, heterogeneous graphs): a dense map is sized by the
# whole graph in every sampling thread, so above this many nodes its hash table (sized by the batch) is used:
# measured at 12M nodes, 0.18 ms more de-duplication a 1024-seed batch, 42 MB less per thread
PERHOP_DENSE_MAX_NODES = 1 << 21
_ONE = np.uint64(1)
_AHEAD = 32  # de-duplication looks this many edges ahead to start fetching their map entries
_AHEAD_NODES = 8  # disjoint de-duplication: frontier nodes ahead whose edges it starts fetching


@njit(cache=True, nogil=True)
def pow2(n):
    """The smallest power of two ≥ ``n`` (at least 64)."""
    p = 64
    while p < n:
        p *= 2
    return p

@njit(cache=True, nogil=True)
def dedup_dense(seen, dense, row, lo, hi, nodes, n_nodes, limit):
    """Phase 4 with a dense map: relabel ``row[lo:hi]`` to local IDs, appending new nodes. Returns the
    node count and whether every ID was inside ``[0, limit)`` (else it stops: a damaged dataset, whose
    IDs must never be used as indices).

    ``seen`` (one bit per node, small enough for L2) says which entries of ``dense`` are valid, so
    most lookups never touch ``dense`` (a new node is only written), and nothing but the bits needs
    resetting after the batch.
    """
    for x in range(lo, hi):
        g = row[x]
        if g < 0 or g >= limit:
            return n_nodes, False
        if x + _AHEAD < hi:  # the map is too large for L2: fetch ahead (measured +8%)
            prefetch_write(dense, row[x + _AHEAD])
        word, bit = g >> 6, _ONE << np.uint64(g & 63)
        if seen[word] & bit:
            row[x] = dense[g]
        else:
            seen[word] |= bit
            dense[g] = n_nodes
            nodes[n_nodes] = g
            row[x] = n_nodes
            n_nodes += 1
    return n_nodes, True


@njit(cache=True, nogil=True)
def dedup_hash(table, row, lo, hi, nodes, n_nodes, limit):
    """Phase 4 with the hash table (large graphs); same contract as ``dedup_dense``."""
    mask = len(table) // 2 - 1
    for x in range(lo, hi):
        g = row[x]
        if g < 0 or g >= limit:
            return n_nodes, False
        if x + _AHEAD < hi:
            prefetch_write(table, 2 * _hash(row[x + _AHEAD], mask))
        slot = _slot(table, g)
        if table[2 * slot] == -1:
            table[2 * slot] = g
            table[2 * slot + 1] = n_nodes
            nodes[n_nodes] = g
            row[x] = n_nodes
            n_nodes += 1
        else:
            row[x] = table[2 * slot + 1]
    return n_nodes, True


@njit(cache=True, nogil=True, inline="always")
def _hash(key, mask):
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(32)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True, inline="always")
def _slot(table, key):
    """Slot of ``key`` in the interleaved (key, value) table, or of the empty entry where it goes."""
    mask = len(table) // 2 - 1
    slot = _hash(key, mask)
    while table[2 * slot] != key and table[2 * slot] != -1:
        slot = (slot + 1) & mask
    return slot


@njit(cache=True, nogil=True)
def rehash(table, capacity):
    out = np.full(2 * capacity, -1, np.int64)
    for i in range(len(table) // 2):
        if table[2 * i] != -1:
            slot = _slot(out, table[2 * i])
            out[2 * slot] = table[2 * i]
            out[2 * slot + 1] = table[2 * i + 1]
    return out


@njit(cache=True, nogil=True)
def insert_seeds(seen, dense, table, seeds, nodes):
    """Seeds take local IDs ``0..len(seeds)-1`` in order; a repeated seed maps to its first position."""
    for i in range(len(seeds)):
        g = seeds[i]
        nodes[i] = g
        if len(seen):
            word, bit = g >> 6, _ONE << np.uint64(g & 63)
            if not seen[word] & bit:
                seen[word] |= bit
                dense[g] = i
        else:
            slot = _slot(table, g)
            if table[2 * slot] == -1:
                table[2 * slot] = g
                table[2 * slot + 1] = i


@njit(cache=True, nogil=True)
def forget(seen, table, nodes, n_nodes):
    """Empty the map for the next batch in O(nodes sampled)."""
    if len(seen) > 0:
        for i in range(n_nodes):
            seen[nodes[i] >> 6] = 0  # every bit set belongs to some sampled node: clear whole words
        return
    slots = np.empty(n_nodes, np.int64)  # find every slot while the probe chains are intact
    for i in range(n_nodes):
        slots[i] = _slot(table, nodes[i])
    for i in range(n_nodes):
        table[2 * slots[i]] = -1


@njit(cache=True, nogil=True)
def dedup_disjoint(table, row, col, col_batch, lo, hi, nodes, batch_of, n_nodes, num_nodes):
    """Phase 4 of disjoint sampling: local IDs keyed by (subgraph, node) in the interleaved hash table
    (key ``subgraph * num_nodes + node``; edge ``x`` is in subgraph ``col_batch[col[x]]``); a new node's
    global ID goes to ``nodes``, its subgraph to ``batch_of``. Returns ``(n_nodes, valid)`` as
    :func:`dedup_hash`."""
    mask = len(table) // 2 - 1
    for x in range(lo, hi):
        g = row[x]
        if g < 0 or g >= num_nodes:
            return n_nodes, False
        if x + _AHEAD < hi:
            ahead = col_batch[col[x + _AHEAD]] * num_nodes + row[x + _AHEAD]
            prefetch_write(table, 2 * _hash(ahead, mask))
        b = col_batch[col[x]]
        slot = _slot(table, b * num_nodes + g)
        if table[2 * slot] == -1:
            table[2 * slot] = b * num_nodes + g
            table[2 * slot + 1] = n_nodes
            nodes[n_nodes] = g
            batch_of[n_nodes] = b
            row[x] = n_nodes
            n_nodes += 1
        else:
            row[x] = table[2 * slot + 1]
    return n_nodes, True


@njit(cache=True, nogil=True)
def forget_disjoint(table, nodes, batch_of, n_nodes, num_nodes):
    """Empty the table for the next batch in O(nodes sampled)."""
    slots = np.empty(n_nodes, np.int64)  # every slot found while the probe chains are intact
    for i in range(n_nodes):
        slots[i] = _slot(table, batch_of[i] * num_nodes + nodes[i])
    for i in range(n_nodes):
        table[2 * slots[i]] = -1


@njit(cache=True, nogil=True)
def insert_seeds_disjoint(table, seeds, nodes, batch_of, num_nodes, first):
    """Seed ``i`` is subgraph ``first + i``'s first node (local ID ``i``)."""
    for i in range(len(seeds)):
        key = (first + i) * num_nodes + seeds[i]
        slot = _slot(table, key)
        table[2 * slot] = key
        table[2 * slot + 1] = i
        nodes[i] = seeds[i]
        batch_of[i] = first + i


@njit(cache=True, nogil=True)
def _edge_ranges(col, lo, hi, f_lo, f_hi):
    """First edge and edge count of each frontier node (a node's edges are contiguous): one write per run of
    equal ``col``, not a count incremented per edge (each increment waited for the store before it)."""
    first, count = np.zeros(f_hi - f_lo, np.int64), np.zeros(f_hi - f_lo, np.int64)
    cols = col[lo:hi]  # indexed from 0 (see sampling.kernels.draws.uniform_draws)
    x, n = 0, hi - lo
    while x < n:
        c, y = cols[x], x + 1
        while y < n and cols[y] == c:
            y += 1
        first[c - f_lo], count[c - f_lo] = lo + x, y - x
        x = y
    return first, count


_NODE_BITS = 40  # a subgraph table's key: its tag above the node ID's 40 bits (IDs below 2**40)
_TAGS = 1 << (62 - _NODE_BITS)  # tags before the table is zeroed again (keys stay below 2**62)
_SPARSE_MAX = 1 << 16  # up to this many slots a subgraph's table is kept 1/8 full, else 1/2


@njit(cache=True, nogil=True)
def dedup_subgraphs(out, lo, hi, f_lo, f_hi, nodes, batch_of, n_nodes, num_nodes, starts, h, slots):
    """Phase 4 of disjoint sampling, one subgraph at a time, through a small table that holds only that
    subgraph's nodes (it stays in L1/L2, unlike one table keyed by (subgraph, node) for the batch): the
    hop's edges ``[lo, hi)`` of ``out`` (:class:`~sampling.kernels.structs.Edges`) get local source IDs.

    The frontier ``[f_lo, f_hi)`` is ordered by subgraph (seeds are; each hop appends its new nodes
    subgraph by subgraph); ``starts[j, b]`` is the first local ID of subgraph ``b`` among the nodes found
    in hop ``j - 1`` (``j = 0``: the seeds), ``starts[j, -1]`` their end; row ``h + 1`` is filled here.
    ``slots`` is the table, scratch zeroed before a batch's first hop and grown here as needed: slot ``i``
    holds a key at ``2i`` and its local ID right after it: one line read per probe, not one in each of two
    arrays (docs/sampling.md, Disjoint). Each (hop, subgraph) tags its keys (``tag << 40 | node``, node IDs
    below 2**40), so an entry of any other tag reads as empty and nothing is cleared between
    subgraphs. The table is kept mostly empty: probe loops that rarely run are the speed (measured
    1.9x over a half-full table that is cleared after each subgraph). Returns ``(n_nodes, valid, slots)``
    (``valid`` as :func:`dedup_hash`)."""
    num_sub = starts.shape[1] - 1
    row = out.row
    first, count = _edge_ranges(out.col, lo, hi, f_lo, f_hi)
    t = f_lo
    for b in range(num_sub):
        starts[h + 1, b] = n_nodes
        if t >= f_hi or batch_of[t] != b:
            continue
        t_end, edges = t, 0
        while t_end < f_hi and batch_of[t_end] == b:
            edges += count[t_end - f_lo]
            t_end += 1
        prior = 0
        for j in range(h + 1):
            prior += starts[j, b + 1] - starts[j, b]
        cap = pow2(8 * (prior + edges))
        if cap > _SPARSE_MAX:
            cap = max(_SPARSE_MAX, pow2(2 * (prior + edges)))
        if len(slots) < 2 * cap:
            slots = np.zeros(2 * cap, np.int64)
        tag = (h * num_sub + b) % (_TAGS - 1) + 1
        if tag == 1 and h * num_sub + b > 0:  # the tags wrap (a batch of millions of subgraph hops)
            slots[:] = 0
        lo_key, hi_key = tag << _NODE_BITS, (tag + 1) << _NODE_BITS  # this subgraph's keys
        mask = cap - 1
        for j in range(h + 1):  # the subgraph's nodes so far (distinct: each goes to a free slot)
            for i in range(starts[j, b], starts[j, b + 1]):
                slot = _hash(nodes[i], mask)
                while lo_key <= slots[2 * slot] < hi_key:
                    slot = (slot + 1) & mask
                slots[2 * slot], slots[2 * slot + 1] = lo_key | nodes[i], i
        for u in range(t - f_lo, t_end - f_lo):
            if u + _AHEAD_NODES < t_end - f_lo:  # each node's edges lie elsewhere: fetch ahead
                prefetch_write(row, first[u + _AHEAD_NODES])
            for x in range(first[u], first[u] + count[u]):
                g = row[x]
                if g < 0 or g >= num_nodes:
                    return n_nodes, False, slots
                key = lo_key | g
                slot = _hash(g, mask)
                while slots[2 * slot] != key and lo_key <= slots[2 * slot] < hi_key:
                    slot = (slot + 1) & mask
                if slots[2 * slot] != key:
                    slots[2 * slot], slots[2 * slot + 1] = key, n_nodes
                    nodes[n_nodes], batch_of[n_nodes] = g, b
                    n_nodes += 1
                row[x] = slots[2 * slot + 1]
        t = t_end
    starts[h + 1, num_sub] = n_nodes
    return n_nodes, True, slots
