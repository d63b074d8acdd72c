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
STREAMS = 2  # label-propagation tasks per round, each walking its run of buckets in order (more streams see
# fewer of each other's moves and cluster worse; a fixed count keeps the result the same on every engine)
MAX_LEVELS = 8
GROWTH = 4  # a cluster grows at most this many times over in one round
REFINE_ROUNDS = 20  # refinement rounds per level at most
SETTLED = 0.02  # a level stops once fewer than this fraction of its vertices changed cluster in a round


@njit(cache=True)
def _propagate(indptr, adjncy, adjwgt, lo, labels, room, weight, degree, dsum, two_m, out):  # pragma: no cover
    """One round over one bucket: each vertex moves to the cluster of highest modularity gain (edge weight
    to it, less what a random graph with these degrees would put there), if that cluster has room."""
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
        expect = degree[v] / two_m
        best, best_score = own, -expect * (dsum[own] - degree[v])  # staying, with no edge into its own cluster
        stay = best_score
        k = 0
        while k < deg:
            label, w = buf[order[k]], 0.0
            while k < deg and buf[order[k]] == label:
                w += wbuf[order[k]]
                k += 1
            if label == own:
                stay = w - expect * (dsum[own] - degree[v])
                if stay >= best_score:
                    best, best_score = own, stay
                continue
            score = w - expect * dsum[label]
            if score > best_score and score > stay and room[label] >= weight[v]:
                best, best_score = label, score
        if best != own and best_score > stay:
            room[own] += weight[v]
            room[best] -= weight[v]
            dsum[own] -= degree[v]
            dsum[best] += degree[v]
            labels[v] = best  # later vertices of this stream see the move at once
            out[i] = best


def _streams(level: Level) -> list[range]:
    """The buckets each label-propagation task walks in order: :data:`STREAMS` runs of consecutive buckets."""
    cuts = np.linspace(0, level.buckets, min(STREAMS, level.buckets) + 1).astype(int)
    return [range(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def propagate_stream(buckets: range, *, scratch: Scratch, level: Level, labels: np.ndarray, room: np.ndarray,
                     weight: np.ndarray, degree: np.ndarray, dsum: np.ndarray, two_m: float) -> np.ndarray:
    """Stage ``cluster``: one round of label propagation over a run of buckets, one bucket in memory at a
    time, every move seen at once by the vertices after it; the run's new labels.

    ``room`` is this stream's share of every cluster's headroom, so streams moving at once cannot
    overfill a cluster; ``dsum`` is every cluster's total degree.
    """
    labels, room, dsum, out = labels.copy(), room.copy(), dsum.copy(), []
    for bucket in buckets:
        indptr, adjncy, adjwgt = level.piece(scratch, bucket)
        out.append(np.empty(len(indptr) - 1, labels.dtype))
        _propagate(indptr, adjncy, np.zeros(0) if adjwgt is None else adjwgt, int(level.bounds[bucket]), labels,
                   room, weight, degree, dsum, float(two_m), out[-1])
    return np.concatenate(out) if out else np.zeros(0, labels.dtype)


def cluster_level(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray, degree: np.ndarray,
                  cap: float, progress: Progress | None = None) -> tuple[np.ndarray, int]:
    """Size-constrained label propagation by modularity gain on one level, until settled: each vertex's
    cluster (``0..C-1``) and ``C``. ``degree``: each vertex's total degree in the fine graph."""
    labels = np.arange(level.size, dtype=np.int32 if level.size < 2**31 else np.int64)
    weight, degree = weight.astype(np.float32), degree.astype(np.float32)  # 4 bytes a vertex on the wire
    streams = _streams(level)
    for _ in range(MAX_ROUNDS):
        sizes = np.bincount(labels, weights=weight, minlength=level.size)
        # a cluster grows at most GROWTH-fold (from at least the mean vertex) in a round: clusters grow by
        # majority, not by who moved first
        room = np.minimum(cap - sizes, GROWTH * np.maximum(sizes, weight.mean()))
        room = (room / len(streams)).astype(np.float32)
        dsum = np.bincount(labels, weights=degree, minlength=level.size).astype(np.float32)
        pieces = engine.map("cluster", propagate_stream, streams, progress, None, scratch=scratch, level=level,
                            labels=labels, room=room, weight=weight, degree=degree, dsum=dsum,
                            two_m=max(float(degree.sum()), 1.0))
        del room, dsum
        new = np.concatenate(pieces)
        changed = int(np.count_nonzero(new != labels))
        logger.debug("label propagation on %d vertices: %d moved", level.size, changed)
        labels = new
        if changed < SETTLED * level.size:
            break
    _, cluster = np.unique(labels, return_inverse=True)
    return cluster.astype(labels.dtype), int(cluster.max()) + 1 if len(cluster) else 0


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


def coarsen(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray, degree: np.ndarray,
            clusters: int, fits: Callable[[int, int], bool], progress: Progress | None = None
            ) -> tuple[list[tuple[Level, np.ndarray]], Level, np.ndarray]:
    """Contract ``level`` until it has at most ``4 * clusters`` vertices and METIS on it ``fits(vertices,
    edges)`` one task, or until it stops shrinking.

    No cluster outweighs ``weight.sum() / clusters``. Returns the levels contracted, each with the
    cluster (next level's vertex) of each of its vertices, the last level, and that level's edge-weight
    histogram (see :func:`reduce_bucket`).
    """
    cap = float(weight.sum()) / clusters
    hist = np.zeros((2, 64))
    levels: list[tuple[Level, np.ndarray]] = []
    for depth in range(1, MAX_LEVELS + 1):
        cluster, count = cluster_level(engine, scratch, level, weight, degree, cap, progress)
        logger.info("coarsening level %d: %d vertices into %d clusters", depth, level.size, count)
        if count > 0.95 * level.size:
            break
        levels.append((level, cluster))
        level, hist = contract(engine, scratch, level, cluster, count, f"level{depth}", progress)
        weight = np.bincount(cluster, weights=weight, minlength=count)
        degree = np.bincount(cluster, weights=degree, minlength=count)
        if level.size <= 4 * clusters and fits(level.size, int(hist[0].sum())):
            break
    return levels, level, hist


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
def _propose(indptr, adjncy, adjwgt, lo, parts, over, target, gain):  # pragma: no cover - numba
    """For each vertex, the other part most of its edge weight leads to, and the gain of moving there
    (edge weight there less edge weight at home). Vertices propose a move when it gains, or, in a part
    that is ``over`` its cap, whatever it costs (-inf: no other part to go to)."""
    num_parts = len(over)
    counts = np.zeros(num_parts, np.float64)
    for i in range(len(indptr) - 1):
        own = parts[lo + i]
        counts[:] = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            counts[parts[adjncy[k]]] += 1.0 if adjwgt.shape[0] == 0 else adjwgt[k]
        target[i], gain[i] = own, -np.inf
        for p in range(num_parts):
            if p != own and counts[p] - counts[own] > gain[i]:
                target[i], gain[i] = p, counts[p] - counts[own]
        if gain[i] <= 0 and not over[own]:
            target[i], gain[i] = own, -np.inf


@njit(cache=True)
def _accept(movers, target, gain, parts, weight, load, cap, passes):  # pragma: no cover - numba
    """Apply proposed moves, best gain first (``movers`` in that order), each only while its target part
    stays within ``cap`` in every constraint; a move that loses edge weight only while its own part is
    still over ``cap``. Later passes take moves that earlier departures made room for (so parts can
    trade vertices). Returns how many moved."""
    done = np.zeros(len(movers), np.bool_)
    moved = 0
    for _ in range(passes):
        before = moved
        for j in range(len(movers)):
            if done[j]:
                continue
            v, b = movers[j], target[j]
            a = parts[v]
            fits, needed = True, gain[j] > 0
            for c in range(load.shape[1]):
                if load[b, c] + weight[v, c] > cap[c]:
                    fits = False
                if load[a, c] > cap[c] and weight[v, c] > 0:
                    needed = True
            if fits and needed:
                for c in range(load.shape[1]):
                    load[b, c] += weight[v, c]
                    load[a, c] -= weight[v, c]
                parts[v] = b
                done[j] = True
                moved += 1
        if moved == before:
            break
    return moved


def propose_stream(buckets: range, *, scratch: Scratch, level: Level, parts: np.ndarray,
                   over: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stage ``refine``: the moves a run of buckets' vertices propose, as (vertices, target parts, gains)."""
    found = []
    for bucket in buckets:
        indptr, adjncy, adjwgt = level.piece(scratch, bucket)
        target, gain = np.empty(len(indptr) - 1, parts.dtype), np.empty(len(indptr) - 1, np.float64)
        _propose(indptr, adjncy, np.zeros(0) if adjwgt is None else adjwgt, int(level.bounds[bucket]), parts, over,
                 target, gain)
        keep = np.flatnonzero(gain > -np.inf)
        found.append(((keep + int(level.bounds[bucket])).astype(parts.dtype), target[keep],
                      gain[keep].astype(np.float32)))
    return tuple(np.concatenate([f[k] for f in found]) for k in range(3)) if found else \
        (np.zeros(0, parts.dtype), np.zeros(0, parts.dtype), np.zeros(0, np.float32))


def refine_parts(engine: Engine, scratch: Scratch, level: Level, parts: np.ndarray, weights: np.ndarray,
                 num_parts: int, target: float, progress: Progress | None = None) -> int:
    """Balanced label-propagation refinement of ``parts`` (in place) on a graph on disk: in each round every
    vertex proposes the part most of its edge weight leads to (the streams in parallel), and the client
    applies the proposals best gain first while no constraint's load passes ``target`` times its mean;
    vertices of a part over that leave it, least loss first, until it is not. Returns the moves made."""
    def proposals(over: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = engine.map("refine", propose_stream, [range(b, b + 1) for b in range(level.buckets)], progress,
                           None, scratch=scratch, level=level, parts=parts, over=over)
        return tuple(np.concatenate([f[k] for f in found]) for k in range(3))
    return _refine_rounds(proposals, parts, weights, num_parts, target)


def refine_graph(xadj: np.ndarray, adjncy: np.ndarray, parts: np.ndarray, weights: np.ndarray, num_parts: int,
                 target: float, adjwgt: np.ndarray | None = None) -> int:
    """:func:`refine_parts` on a graph in memory (edge weights ``adjwgt``, or 1); returns the moves made."""
    def proposals(over: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        node_target, gain = np.empty_like(parts), np.empty(len(parts), np.float64)
        _propose(xadj, adjncy, np.zeros(0) if adjwgt is None else adjwgt.astype(np.float64), 0, parts, over,
                 node_target, gain)
        keep = np.flatnonzero(gain > -np.inf)
        return keep, node_target[keep], gain[keep]
    return _refine_rounds(proposals, parts, weights, num_parts, target)


def _refine_rounds(proposals: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
                   parts: np.ndarray, weights: np.ndarray, num_parts: int, target: float) -> int:
    weight = weights.astype(np.float64)
    cap = weight.sum(axis=0) / num_parts * (target - 1e-9)  # strictly within target, rounding included
    moves = 0
    for _ in range(REFINE_ROUNDS):
        load = np.stack([np.bincount(parts, weights=weight[:, c], minlength=num_parts)
                         for c in range(weight.shape[1])], axis=1)
        movers, to, gain = proposals((load > cap[None, :]).any(axis=1))
        order = np.argsort(-gain, kind="stable")
        changed = int(_accept(movers[order], to[order], gain[order], parts, weight, load, cap, 4))
        moves += changed
        logger.debug("refinement round: %d of %d vertices moved", changed, len(parts))
        if changed < SETTLED * len(parts) / 20:
            break
    return moves
