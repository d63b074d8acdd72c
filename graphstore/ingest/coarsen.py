"""Coarsen a graph too large for one task into clusters METIS can partition, on any engine.

Multilevel, size-constrained label propagation. A *level* is a graph stored as CSR pieces on disk,
one per bucket of consecutive vertices (level 0: the pieces ``adjacency.py`` wrote). On a level,
every vertex starts as its own cluster; in each round each bucket's vertices join the cluster that
most of their edge weight leads to, unless it would outgrow ``cap``. Then ``contract`` maps every
edge to its pair of clusters, routing the pairs to cluster-range buckets, and ``reduce`` sums them
into the next level's pieces (edge weight: how many fine edges join two clusters). Levels repeat
until the graph has about the number of clusters METIS may see. The client holds one label per
vertex; tasks hold one bucket and read the per-vertex arrays from files. After METIS,
``refine.py`` moves fine nodes towards the part most of their neighbours are in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
import numpy as np
from numba import njit

from graphstore.ingest.adjacency import Level
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.scratch import Scratch, StoredArray

logger = logging.getLogger(__name__)

MAX_ROUNDS = 8  # label-propagation rounds per level at most
STREAMS = 2  # label-propagation tasks per round, each walking its run of buckets in order (more streams see
# fewer of each other's moves and cluster worse; a fixed count keeps the result the same on every engine)
MAX_LEVELS = 8
GROWTH = 4  # a cluster grows at most this many times over in one round
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


def propagate_stream(buckets: range, *, scratch: Scratch, level: Level, labels: StoredArray, room: StoredArray,
                     weight: StoredArray, degree: StoredArray, dsum: StoredArray, two_m: float) -> np.ndarray:
    """Stage ``cluster``: one round of label propagation over a run of buckets, one bucket in memory at a
    time, every move seen at once by the vertices after it; the run's new labels.

    ``room`` is this stream's share of every cluster's headroom, so streams moving at once cannot
    overfill a cluster; ``dsum`` is every cluster's total degree. The per-vertex arrays are files: the
    task copies the three it changes and maps the two it reads (only its own vertices' pages of those).
    """
    labels, room, dsum, out = labels.load(), room.load(), dsum.load(), []
    weight, degree = weight.mapped(), degree.mapped()
    for bucket in buckets:
        indptr, adjncy, adjwgt = level.piece(scratch, bucket)
        out.append(np.empty(len(indptr) - 1, labels.dtype))
        _propagate(indptr, adjncy, np.zeros(0) if adjwgt is None else adjwgt, int(level.bounds[bucket]), labels,
                   room, weight, degree, dsum, float(two_m), out[-1])
    return np.concatenate(out) if out else np.zeros(0, labels.dtype)


@njit(cache=True)
def _sums(labels, values, count):  # pragma: no cover - numba
    """``np.bincount(labels, weights=values, minlength=count)`` without a float64 copy of ``values``."""
    out = np.zeros(count, np.float64)
    for i in range(len(labels)):
        out[labels[i]] += values[i]
    return out


@njit(cache=True)
def _headroom(labels, weight, cap, floor, growth, streams):  # pragma: no cover - numba
    """Each stream's share of every cluster's headroom, as float32: ``cap`` less the cluster's weight, but at
    most ``growth`` times that weight (or ``floor``, the mean vertex, if more)."""
    sizes = _sums(labels, weight, len(labels))
    room = np.empty(len(labels), np.float32)
    for c in range(len(labels)):
        room[c] = min(cap - sizes[c], growth * max(sizes[c], floor)) / streams
    return room


def _room(labels: np.ndarray, weight: np.ndarray, cap: float, streams: int) -> np.ndarray:
    """Each stream's share of every cluster's headroom (float32): a cluster grows at most GROWTH-fold (from at
    least the mean vertex) in a round, so clusters grow by majority, not by who moved first."""
    return _headroom(labels, weight, float(cap), float(weight.mean()), float(GROWTH), float(streams))


@njit(cache=True)
def _degree_sums(labels, degree):  # pragma: no cover - numba
    """Every cluster's total degree (float32; summed in float64)."""
    return _sums(labels, degree, len(labels)).astype(np.float32)


def _ranks(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """``np.unique(labels, return_inverse=True)``'s inverse (labels renumbered ``0..C-1`` in order) and ``C``,
    without sorting: 1 byte a possible label and the result."""
    present = np.zeros(len(labels), bool)
    present[labels] = True
    rank = np.cumsum(present, dtype=labels.dtype)
    count = int(rank[-1]) if len(rank) else 0
    del present
    rank -= 1
    return rank[labels], count


def _array(values: np.ndarray | StoredArray, dtype: type) -> np.ndarray:
    """An array argument that may be a file (level 0's are), as ``dtype``."""
    return values.load().astype(dtype, copy=False) if isinstance(values, StoredArray) else \
        np.asarray(values).astype(dtype, copy=False)


def _as_file(scratch: Scratch, values: np.ndarray | StoredArray, key: str) -> StoredArray:
    """Per-vertex ``values`` as a float32 file tasks read (a file is one already)."""
    return values if isinstance(values, StoredArray) else scratch.put_array(key, np.asarray(values, np.float32))


def cluster_level(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray | StoredArray,
                  degree: np.ndarray | StoredArray, cap: float, progress: Progress | None = None
                  ) -> tuple[np.ndarray, int]:
    """Size-constrained label propagation by modularity gain on one level, until settled: each vertex's
    cluster (``0..C-1``) and ``C``. ``degree``: each vertex's total degree in the fine graph.

    ``weight`` and ``degree`` may be (float32) files. The client holds one label per vertex; each round it
    loads the weights, then the degrees, for a moment to sum them per cluster (the headroom and degree sum
    of every cluster, which tasks read from files with the rest).
    """
    labels = np.arange(level.size, dtype=np.int32 if level.size < 2**31 else np.int64)
    streams = _streams(level)
    files = {"weight": _as_file(scratch, weight, f"{level.prefix}.lp/weight.npy"),
             "degree": _as_file(scratch, degree, f"{level.prefix}.lp/degree.npy")}
    two_m = max(float(files["degree"].load().sum()), 1.0)
    for _ in range(MAX_ROUNDS):
        files["labels"] = scratch.put_array(f"{level.prefix}.lp/labels.npy", labels)
        files["room"] = scratch.put_array(f"{level.prefix}.lp/room.npy",
                                          _room(labels, files["weight"].load(), cap, len(streams)))
        files["dsum"] = scratch.put_array(f"{level.prefix}.lp/dsum.npy", _degree_sums(labels, files["degree"].load()))
        pieces = engine.map("cluster", propagate_stream, streams, progress, None, scratch=scratch, level=level,
                            two_m=two_m, **files)
        changed = 0
        for run, piece in zip(streams, pieces):
            lo, hi = int(level.bounds[run.start]), int(level.bounds[run.stop])
            changed += int(np.count_nonzero(piece != labels[lo:hi]))
            labels[lo:hi] = piece
        del pieces
        logger.debug("label propagation on %d vertices: %d moved", level.size, changed)
        if changed < SETTLED * level.size:
            break
    scratch.remove(f"{level.prefix}.lp")
    return _ranks(labels)


def _split(count: int, buckets: int) -> np.ndarray:
    buckets = max(1, min(buckets, count))
    return (np.arange(buckets + 1, dtype=np.int64) * count) // buckets


def contract_bucket(bucket: int, *, scratch: Scratch, level: Level, cluster: StoredArray, nxt: Level) -> int:
    """Stage ``contract``: one bucket's edges as (cluster, cluster, weight), routed by the first cluster."""
    indptr, adjncy, adjwgt = level.piece(scratch, bucket)
    lo, count = int(level.bounds[bucket]), nxt.size
    cluster = cluster.mapped()
    a = np.repeat(cluster[lo: lo + len(indptr) - 1].astype(np.int64), np.diff(indptr))  # int64: the pair key
    c = cluster[adjncy].astype(np.int64)  # below reaches count**2, past int32 from 46,341 clusters on
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


def contract(engine: Engine, scratch: Scratch, level: Level, cluster: StoredArray, count: int, prefix: str,
             progress: Progress | None = None) -> tuple[Level, np.ndarray]:
    """The next level (clusters as vertices) on disk, and the histogram of its edge weights. ``cluster``: the
    file of each vertex's cluster."""
    nxt = Level(prefix, _split(count, level.buckets))
    engine.map("contract", contract_bucket, list(range(level.buckets)), progress, None, scratch=scratch,
               level=level, cluster=cluster, nxt=nxt)
    hists = engine.map("reduce", reduce_bucket, list(range(nxt.buckets)), progress, None, scratch=scratch, nxt=nxt)
    scratch.remove(f"{prefix}.in")
    return nxt, np.sum(hists, axis=0)


def coarsen(engine: Engine, scratch: Scratch, level: Level, weight: np.ndarray | StoredArray,
            degree: np.ndarray | StoredArray, clusters: int, fits: Callable[[int, int], bool],
            progress: Progress | None = None) -> tuple[list[tuple[Level, StoredArray]], Level, np.ndarray]:
    """Contract ``level`` until it has at most ``4 * clusters`` vertices and METIS on it ``fits(vertices,
    edges)`` one task, or until it stops shrinking.

    No cluster outweighs ``weight.sum() / clusters``. ``weight`` and ``degree`` (per vertex) may be files,
    loaded only while their level is clustered. Returns the levels contracted, each with the file of the
    cluster (next level's vertex) of each of its vertices, the last level, and that level's edge-weight
    histogram (see :func:`reduce_bucket`).
    """
    hist = np.zeros((2, 64))
    levels: list[tuple[Level, StoredArray]] = []
    cap = float(_array(weight, np.float32).sum(dtype=np.float64)) / clusters
    for depth in range(1, MAX_LEVELS + 1):
        cluster, count = cluster_level(engine, scratch, level, weight, degree, cap, progress)
        logger.info("coarsening level %d: %d vertices into %d clusters", depth, level.size, count)
        if count > 0.95 * level.size:
            break
        stored = scratch.put_array(f"level{depth}.cluster.npy", cluster)
        levels.append((level, stored))
        weight = _sums(cluster, _array(weight, np.float32), count)
        degree = _sums(cluster, _array(degree, np.float32), count)
        del cluster
        level, hist = contract(engine, scratch, level, stored, count, f"level{depth}", progress)
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
