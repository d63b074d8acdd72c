"""Coarsen a graph too large for one task into clusters METIS can partition, on any engine.

Multilevel, size-constrained label propagation. A *level* is a graph stored as CSR pieces on disk,
one per bucket of consecutive vertices (level 0: the pieces ``adjacency.py`` wrote). On a level,
every vertex starts as its own cluster; in each round each bucket's vertices join the cluster that
most of their edge weight leads to, unless it would outgrow ``cap``. Then ``contract`` maps every
edge to its pair of clusters, routing the pairs to cluster-range buckets, and ``reduce`` sums them
into the next level's pieces (edge weight: how many fine edges join two clusters). Levels repeat
until the graph has about the number of clusters METIS may see. The client holds one label and one
weight per vertex; tasks hold one bucket. After METIS, :func:`refine_parts` moves fine nodes
towards the part most of their neighbours are in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
import numpy as np
from numba import njit

from graphstore.ingest.adjacency import Level
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.scratch import Scratch

logger = logging.getLogger(__name__)

MAX_ROUNDS = 8  # label-propagation rounds per level at most
MAX_LEVELS = 8
SETTLED = 0.02  # a level stops once fewer than this fraction of its vertices changed cluster in a round


@njit(cache=True)
def _propagate(indptr, adjncy, adjwgt, lo, labels, room, weight, salt, out):  # pragma: no cover - numba
    width = 1
    for i in range(len(indptr) - 1):
        width = max(width, indptr[i + 1] - indptr[i])
    buf = np.empty(width, np.int64)
    wbuf = np.empty(width, np.float64)
    for i in range(len(indptr) - 1):
        v = lo + i
        own = labels[v]
        out[i] = own
        deg = indptr[i + 1] - indptr[i]
        if deg == 0:
            continue
        for k in range(deg):
            buf[k] = labels[adjncy[indptr[i] + k]]
            wbuf[k] = 1.0 if adjwgt.shape[0] == 0 else adjwgt[indptr[i] + k]
        order = np.argsort(buf[:deg])
        best, best_score, best_tie = own, 0.0, -1
        k = 0
        while k < deg:
            label, score = buf[order[k]], 0.0
            while k < deg and buf[order[k]] == label:
                score += wbuf[order[k]]
                k += 1
            if label == own:
                if score > best_score or (score == best_score and best != own):
                    best, best_score = own, score
                continue
            if room[label] < weight[v]:
                continue
            tie = (label * 0x2545F491 + v + salt) & 0xFFFF
            if score > best_score or (score == best_score and best != own and tie > best_tie):
                best, best_score, best_tie = label, score, tie
        if best != own:
            room[own] += weight[v]
            room[best] -= weight[v]
            labels[v] = best  # later vertices of this bucket see the move at once
            out[i] = best


def propagate_bucket(bucket: int, *, scratch: Scratch, level: Level, labels: np.ndarray, room: np.ndarray,
                     weight: np.ndarray, salt: int) -> np.ndarray:
    """Stage ``cluster``: one round of label propagation over one bucket's vertices; their new labels.

    ``room`` is this bucket's share of every cluster's headroom below the cap, so buckets moving at
    once cannot overfill a cluster.
    """
    indptr, adjncy, adjwgt = level.piece(scratch, bucket)
    out = np.empty(len(indptr) - 1, labels.dtype)
    _propagate(indptr, adjncy, np.zeros(0) if adjwgt is None else adjwgt, int(level.bounds[bucket]), labels.copy(),
               room.copy(), weight, int(salt), out)
    return out


def cluster_level(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray, cap: float,
                  progress: Progress | None = None) -> tuple[np.ndarray, int]:
    """Label propagation on one level until settled: each vertex's cluster (``0..C-1``) and ``C``."""
    labels = np.arange(level.size, dtype=np.int64)
    weight = weight.astype(np.float64)
    for round_ in range(MAX_ROUNDS):
        sizes = np.bincount(labels, weights=weight, minlength=level.size)
        room = (cap - sizes) / level.buckets
        pieces = engine.map("cluster", propagate_bucket, list(range(level.buckets)), progress, None,
                            scratch=scratch, level=level, labels=labels, room=room, weight=weight,
                            salt=round_ * 7919 + 1)
        new = np.concatenate(pieces)
        changed = int(np.count_nonzero(new != labels))
        labels = new
        if changed < SETTLED * level.size:
            break
    _, cluster = np.unique(labels, return_inverse=True)
    return cluster.astype(np.int64), int(cluster.max()) + 1 if len(cluster) else 0


def _split(count: int, buckets: int) -> np.ndarray:
    buckets = max(1, min(buckets, count))
    return (np.arange(buckets + 1, dtype=np.int64) * count) // buckets


def contract_bucket(bucket: int, *, scratch: Scratch, level: Level, cluster: np.ndarray, nxt: Level) -> int:
    """Stage ``contract``: one bucket's edges as (cluster, cluster, weight), routed by the first cluster."""
    indptr, adjncy, adjwgt = level.piece(scratch, bucket)
    lo, count = int(level.bounds[bucket]), nxt.size
    a = np.repeat(cluster[lo: lo + len(indptr) - 1], np.diff(indptr))
    c = cluster[adjncy]
    keep = a != c
    key, inverse = np.unique(a[keep] * count + c[keep], return_inverse=True)
    weight = np.bincount(inverse, weights=None if adjwgt is None else adjwgt[keep], minlength=len(key))
    cuts = np.searchsorted(key, nxt.bounds * count)
    for b in range(nxt.buckets):
        if cuts[b + 1] > cuts[b]:
            scratch.put(f"{nxt.prefix}.in/{b:05d}/{bucket:05d}",
                        {"key": key[cuts[b]: cuts[b + 1]], "weight": weight[cuts[b]: cuts[b + 1]].astype(np.int64)})
    return len(key)


def reduce_bucket(bucket: int, *, scratch: Scratch, nxt: Level) -> np.ndarray:
    """Stage ``reduce``: sum one bucket's pairs into the piece ``<prefix>/<bucket>`` of the next level;
    return a histogram of its edge weights: row 0, entry ``k``, counts the edges of weight in
    ``[2**k, 2**(k+1))``; row 1 sums their weights."""
    data = scratch.concat(f"{nxt.prefix}.in/{bucket:05d}", {"key": np.int64, "weight": np.int64})
    order = np.argsort(data["key"], kind="stable")
    key, weight = data["key"][order], data["weight"][order]
    if len(key):
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        key, weight = key[starts], np.add.reduceat(weight, starts)
    lo, hi = int(nxt.bounds[bucket]), int(nxt.bounds[bucket + 1])
    counts = np.bincount(key // nxt.size - lo, minlength=hi - lo).astype(np.int64)
    scratch.put(f"{nxt.prefix}/{bucket:05d}", {"counts": counts, "adjncy": key % nxt.size, "weight": weight})
    bins = np.log2(np.maximum(weight, 1)).astype(np.int64)
    return np.stack([np.bincount(bins, minlength=64), np.bincount(bins, weights=weight, minlength=64)])


def contract(engine: Engine, scratch: Scratch, level: Level, cluster: np.ndarray, count: int, prefix: str,
             progress: Progress | None = None) -> tuple[Level, np.ndarray]:
    """The next level (clusters as vertices) on disk, and the histogram of its edge weights."""
    nxt = Level(prefix, _split(count, level.buckets))
    engine.map("contract", contract_bucket, list(range(level.buckets)), progress, None, scratch=scratch,
               level=level, cluster=cluster, nxt=nxt)
    hists = engine.map("reduce", reduce_bucket, list(range(nxt.buckets)), progress, None, scratch=scratch, nxt=nxt)
    scratch.remove(f"{prefix}.in")
    return nxt, np.sum(hists, axis=0)


def coarsen(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray, clusters: int,
            fits: Callable[[int, int], bool], progress: Progress | None = None
            ) -> tuple[Level, np.ndarray, np.ndarray]:
    """Contract ``level`` until METIS on it ``fits(vertices, edges)`` one task, or it stops shrinking.

    No cluster outweighs ``weight.sum() / clusters``. Returns the last level, its edge-weight
    histogram (see :func:`reduce_bucket`), and each vertex's vertex on that level.
    """
    cap = float(weight.sum()) / clusters
    mapping = np.arange(level.size, dtype=np.int64)
    hist = np.zeros((2, 64))
    for depth in range(1, MAX_LEVELS + 1):
        cluster, count = cluster_level(engine, scratch, level, weight, cap, progress)
        logger.info("coarsening level %d: %d vertices into %d clusters", depth, level.size, count)
        if count > 0.95 * level.size:
            break
        level, hist = contract(engine, scratch, level, cluster, count, f"level{depth}", progress)
        weight = np.bincount(cluster, weights=weight, minlength=count)
        mapping = cluster[mapping]
        if fits(level.size, int(hist[0].sum())):
            break
    return level, hist, mapping


def weight_floor(histogram: np.ndarray, max_entries: int) -> int:
    """The smallest power-of-two edge weight ``w`` such that the edges of weight ``>= w`` are at most
    ``max_entries`` (1: keep every edge)."""
    above = np.cumsum(histogram[::-1])[::-1]  # above[k]: edges of weight >= 2**k
    for k in range(len(histogram)):
        if above[k] <= max_entries:
            return 1 << k
    return 1 << len(histogram)


def load_level(scratch: Scratch, level: Level, floor: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xadj, adjncy, adjwgt)`` of a whole level, keeping edges of weight ``>= floor`` (both directions
    of an edge have the same weight, so the result stays symmetric)."""
    counts, adjncy, adjwgt = [], [], []
    for bucket in range(level.buckets):
        indptr, adj, wgt = level.piece(scratch, bucket)
        wgt = np.ones(len(adj), np.int64) if wgt is None else wgt
        keep = wgt >= floor
        owner = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        counts.append(np.bincount(owner[keep], minlength=len(indptr) - 1))
        adjncy.append(adj[keep])
        adjwgt.append(wgt[keep])
    xadj = np.zeros(level.size + 1, np.int64)
    np.cumsum(np.concatenate(counts), out=xadj[1:])
    return xadj, np.concatenate(adjncy).astype(np.int64), np.concatenate(adjwgt)


@njit(cache=True)
def _refine(indptr, adjncy, lo, parts, room, weight, out):  # pragma: no cover - numba
    counts = np.zeros(room.shape[0], np.int64)
    for i in range(len(indptr) - 1):
        v = lo + i
        own = parts[v]
        out[i] = own
        if indptr[i + 1] == indptr[i]:
            continue
        counts[:] = 0
        for k in range(indptr[i], indptr[i + 1]):
            counts[parts[adjncy[k]]] += 1
        best, best_gain = own, 0
        for p in range(room.shape[0]):
            gain = counts[p] - counts[own]
            if p == own or gain <= best_gain:
                continue
            fits = True
            for c in range(room.shape[1]):
                if room[p, c] < weight[v, c]:
                    fits = False
            if fits:
                best, best_gain = p, gain
        if best != own:
            for c in range(room.shape[1]):
                room[best, c] -= weight[v, c]
                room[own, c] += weight[v, c]
            parts[v] = best
            out[i] = best


def refine_bucket(bucket: int, *, scratch: Scratch, level: Level, parts: np.ndarray, room: np.ndarray,
                  weight: np.ndarray) -> np.ndarray:
    """Stage ``refine``: move each node of one bucket to the part holding more of its neighbours, where
    that part has ``room`` (this bucket's share of every constraint's headroom); the bucket's new parts."""
    indptr, adjncy, _ = level.piece(scratch, bucket)
    out = np.empty(len(indptr) - 1, parts.dtype)
    _refine(indptr, adjncy, int(level.bounds[bucket]), parts.copy(), room.copy(), weight, out)
    return out


def refine_parts(engine: Engine, scratch: Scratch, level: Level, parts: np.ndarray, weights: np.ndarray,
                 num_parts: int, target: float, progress: Progress | None = None) -> int:
    """Label-propagation refinement of ``parts`` (in place) on a graph on disk: rounds in which a node
    moves to the part most of its neighbours are in while no constraint's load passes ``target`` times
    its mean. Each bucket gets an equal share of the headroom, so buckets moving at once cannot
    overfill a part. Returns how many moves were made."""
    def one_round(room: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return np.concatenate(engine.map("refine", refine_bucket, list(range(level.buckets)), progress, None,
                                         scratch=scratch, level=level, parts=parts, room=room / level.buckets,
                                         weight=weight))
    return _refine_rounds(one_round, parts, weights, num_parts, target)


def refine_graph(xadj: np.ndarray, adjncy: np.ndarray, parts: np.ndarray, weights: np.ndarray, num_parts: int,
                 target: float) -> int:
    """:func:`refine_parts` on a graph in memory (one sequential pass a round); returns the moves made."""
    def one_round(room: np.ndarray, weight: np.ndarray) -> np.ndarray:
        out = np.empty_like(parts)
        _refine(xadj, adjncy, 0, parts.copy(), room, weight, out)
        return out
    return _refine_rounds(one_round, parts, weights, num_parts, target)


def _refine_rounds(one_round: Callable[[np.ndarray, np.ndarray], np.ndarray], parts: np.ndarray,
                   weights: np.ndarray, num_parts: int, target: float) -> int:
    weight = weights.astype(np.float64)
    cap = weight.sum(axis=0) / num_parts * (target - 1e-9)  # strictly within target, rounding included
    moves = 0
    for _ in range(MAX_ROUNDS):
        load = np.stack([np.bincount(parts, weights=weight[:, c], minlength=num_parts)
                         for c in range(weight.shape[1])], axis=1)
        new = one_round(cap[None, :] - load, weight)
        changed = int(np.count_nonzero(new != parts))
        parts[:] = new
        moves += changed
        if changed < SETTLED * len(parts) / 20:
            break
    return moves
