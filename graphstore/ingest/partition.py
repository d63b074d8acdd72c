"""Assign every node to a partition: METIS (balanced nodes, train nodes and edges), random, or range."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.adjacency import Constraints, Level, NodeSpace, bucket_degrees, bucket_edges, load_adjacency
from graphstore.ingest.budget import Budget, local_budget
from graphstore.ingest.chunks import ChunkedSource
from graphstore.ingest.coarsen import coarsen, load_level, weight_floor
from graphstore.ingest.engine import Engine, LocalEngine
from graphstore.ingest.rebalance import TARGET, edge_cut, imbalance, part_loads, rebalance
from graphstore.ingest.refine import refine_graph, refine_parts
from graphstore.ingest.scratch import Scratch, StoredArray
from graphstore.ingest.shielded import run_parts
from graphstore.ingest.source import GraphSource, NodeType

logger = logging.getLogger(__name__)

METHODS = ("metis", "random", "range")
Progress = Callable[[str, int, int], None]
_BUCKET_SLACK = 1.5  # buckets are node ranges: room for a range with more edges than the mean
CLUSTERS_PER_PART = 16  # coarsening grows clusters up to 1/16 of a part: big enough to find communities,
# small enough for the refinement on the way down to balance the parts
METIS_MAX_EDGES = 1 << 25  # undirected edges METIS sees at most (about 2.7 GB of METIS memory)


def partition_graph(source: ChunkedSource, num_parts: int, method: str, seed: int = 0, *, engine: Engine,
                    scratch: Scratch, budget: Budget, train: dict[NodeType, np.ndarray] | None = None,
                    progress: Progress | None = None, metis_max_edges: int | None = METIS_MAX_EDGES,
                    keep_ends: bool = False) -> tuple[dict[NodeType, np.ndarray], dict[str, Any]]:
    """Return, per node type, the partition (int32) of every input node, and partitioner details.

    Heterogeneous graphs are partitioned on their homogeneous view; each type keeps its own IDs.
    METIS balances nodes of each type, ``train`` nodes (flags per type) and stored edges. Its input
    is built from the edge chunks in buckets on ``engine``; when the graph (or its uniform sample of
    ``metis_max_edges`` undirected edges) does not fit one task of ``budget``, METIS partitions a
    coarsened graph of clusters instead (``coarsen.py``) and the clusters' parts are projected back.
    With ``keep_ends``, METIS leaves each edge chunk's endpoints in ``scratch`` (``ends/<chunk>``, chunks
    without edge attributes) for the ``route`` stage; the other methods read no edge.
    """
    if method not in METHODS:
        raise InvalidInputError(f"partition method {method!r} is not one of {METHODS}; pass --method metis|random|range")
    if num_parts == 1:
        return {t: np.zeros(n, np.int32) for t, n in source.num_nodes.items()}, {}
    if method == "range":
        return {t: _range_parts(n, num_parts) for t, n in source.num_nodes.items()}, {}
    if method == "random":
        rng = np.random.default_rng(seed)
        return {t: _range_parts(n, num_parts)[rng.permutation(n)] for t, n in source.num_nodes.items()}, {}
    return _metis(source, num_parts, seed, engine, scratch, budget, train or {}, progress, metis_max_edges,
                  keep_ends)


def partition_nodes(source: GraphSource, num_parts: int, method: str, seed: int = 0,
                    progress: Progress | None = None, metis_max_edges: int | None = METIS_MAX_EDGES
                    ) -> tuple[dict[NodeType, np.ndarray], dict[str, Any]]:
    """:func:`partition_graph` for an in-memory graph, in this process (intermediate files in a temp dir).

    Examples
    --------
    >>> from graphstore.ingest.source import EdgeTable, GraphSource, NodeTable
    >>> g = GraphSource({None: NodeTable(4)}, {None: EdgeTable(np.array([0, 1]), np.array([1, 2]))})
    >>> partition_nodes(g, 2, "range")[0][None].tolist()
    [0, 0, 1, 1]
    """
    from graphstore.ingest.chunked_graph import chunked_from_graph

    train = {t: n.attrs["train_mask"].take(np.arange(n.num_nodes)).astype(bool)
             for t, n in source.nodes.items() if "train_mask" in n.attrs}
    with _temp_scratch() as scratch:
        return partition_graph(chunked_from_graph(source, 1 << 22), num_parts, method, seed, engine=LocalEngine(),
                               scratch=scratch, budget=local_budget(), train=train, progress=progress,
                               metis_max_edges=metis_max_edges)


def symmetric_adjacency(source: GraphSource, offsets: dict[NodeType, int], total: int, max_edges: int | None = None,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """CSR (xadj, adjncy) of the undirected homogeneous view of an in-memory graph, without self-loops or
    duplicates, as METIS sees it (a uniform sample of about ``max_edges`` undirected edges when there
    are more); the kept fraction is returned third. ``offsets``/``total``: the homogeneous view."""
    from graphstore.ingest.chunked_graph import chunked_from_graph

    space = NodeSpace.build({t: n.num_nodes for t, n in source.nodes.items()}, 1)
    if space.offsets != offsets or space.total != total:
        raise InvalidInputError(f"offsets {offsets} / total {total} are not the graph's homogeneous view "
                                f"({space.offsets}, {space.total})")
    with _temp_scratch() as scratch:
        entries = _adjacency(chunked_from_graph(source, 1 << 22), space, LocalEngine(), scratch, None)[1]
        return load_adjacency(scratch, space, entries, max_edges, seed)


def _temp_scratch() -> Any:
    import contextlib
    import tempfile

    from graphstore.storage.local import LocalLocation

    @contextlib.contextmanager
    def scratch() -> Any:
        with tempfile.TemporaryDirectory(prefix="graphstore-partition-") as tmp:
            yield Scratch(LocalLocation(tmp), "scratch")
    return scratch()


def _range_parts(num_nodes: int, num_parts: int) -> np.ndarray:
    return (np.arange(num_nodes, dtype=np.int64) * num_parts // max(num_nodes, 1)).astype(np.int32)


def _adjacency(source: ChunkedSource, space: NodeSpace, engine: Engine, scratch: Scratch, progress: Progress | None,
               constraints: Constraints | None = None, keep_ends: bool = False) -> tuple[np.ndarray, int, np.ndarray]:
    """Stages ``adjacency`` and ``degrees``: the CSR pieces and the METIS weights on disk; every node's
    combined weight (float32, homogeneous IDs), the count of distinct symmetric entries, and every node's
    degree there (int32)."""
    if constraints is None:
        constraints = Constraints.build(space, {}, sum(source.num_edges.values()))
    chunks = list(enumerate(source.edge_chunks))
    engine.map("adjacency", bucket_edges, chunks, progress, [c.stop - c.start for _, c in chunks],
               scratch=scratch, space=space, keep_ends=keep_ends)
    found = engine.map("degrees", bucket_degrees, list(range(space.buckets)), progress, None, scratch=scratch,
                       space=space, constraints=constraints)
    scratch.remove("adj")
    share, degree = np.empty(space.total, np.float32), np.empty(space.total, np.int32)
    for bucket, piece in enumerate(found):
        share[space.bounds[bucket]: space.bounds[bucket + 1]] = piece.share
        degree[space.bounds[bucket]: space.bounds[bucket + 1]] = piece.degree
    return share, sum(f.entries for f in found), degree


def _metis(source: ChunkedSource, num_parts: int, seed: int, engine: Engine, scratch: Scratch, budget: Budget,
           train: dict[NodeType, np.ndarray], progress: Progress | None, max_edges: int | None,
           keep_ends: bool = False) -> tuple[dict[NodeType, np.ndarray], dict[str, Any]]:
    total_edges = sum(source.num_edges.values())
    buckets = math.ceil(2 * total_edges * _BUCKET_SLACK / budget.bucket_entries)
    space = NodeSpace.build(source.num_nodes, buckets)
    constraints = Constraints.build(space, train, total_edges)
    if progress:
        progress("partition", 0, 3)
    share, entries, degree = _adjacency(source, space, engine, scratch, progress, constraints, keep_ends)
    names = list(constraints.names)
    if progress:
        progress("partition", 1, 3)
    seen = entries if max_edges is None else min(entries, 2 * max_edges)
    if budget.metis_fits(space.total, seen):
        del share, degree
        parts, details = engine.map("metis", _whole_metis, [num_parts], None, None, scratch=scratch, space=space,
                                    entries=entries, max_edges=max_edges, seed=seed, names=names)[0]
    else:  # the client keeps no node-sized array through the coarsening: level 0's are files tasks read
        weight = scratch.put_array("level0/weight.npy", share)
        degree = scratch.put_array("level0/degree.npy", degree.astype(np.float32))
        del share
        parts, details = _coarse_metis(engine, scratch, space, budget, weight, degree, names, num_parts, seed,
                                       progress)
    if progress:
        progress("partition", 3, 3)
    assign = {t: parts[space.offsets[t]: space.offsets[t] + n] for t, n in source.num_nodes.items()}
    return assign, details


def _whole_metis(num_parts: int, *, scratch: Scratch, space: NodeSpace, entries: int, max_edges: int | None,
                 seed: int, names: list[str]) -> tuple[np.ndarray, dict[str, Any]]:
    """Stage ``metis`` on the whole graph (or its edge sample): parts per homogeneous node, and details."""
    weights = np.concatenate([space.level.vertex_weights(scratch, b) for b in range(space.buckets)])
    xadj, adjncy, fraction = load_adjacency(scratch, space, entries, max_edges, seed)
    if fraction < 1.0:
        logger.info("METIS sees a uniform %.1f%% sample of the edges (metis_max_edges=%d)", 100 * fraction, max_edges)
    parts, scheme, moved = _best_metis(xadj, adjncy, None, weights, names, num_parts, seed)
    _report(parts, weights, names, num_parts, scheme, moved)
    refined = refine_graph(xadj, adjncy, parts, weights, num_parts, TARGET)
    return parts, {"metis_edge_fraction": round(fraction, 6), "metis_scheme": scheme, "rebalanced_nodes": moved,
                   "refined_nodes": refined}


def _coarse_metis(engine: Engine, scratch: Scratch, space: NodeSpace, budget: Budget, weight: StoredArray,
                  degree: StoredArray, names: list[str], num_parts: int, seed: int,
                  progress: Progress | None) -> tuple[np.ndarray, dict[str, Any]]:
    """A multilevel partition: coarsen (label propagation) until METIS fits one task, partition the top
    level with METIS (edges weighted by the fine edges they stand for), then on the way back down
    project the parts to each level and refine them there, down to the nodes. ``weight``: every node's
    constraints combined, ``degree`` its degree (files: the client loads them only while it clusters level 0)."""
    clusters = min(budget.coarse_vertices, num_parts * CLUSTERS_PER_PART)
    levels, top, hist = coarsen(engine, scratch, space.level, weight, degree, clusters, budget.metis_fits, progress)
    floor = weight_floor(hist[0], budget.metis_entries(top.size)) if levels else 1
    kept = float(hist[1][int(math.log2(floor)):].sum() / max(hist[1].sum(), 1)) if levels else 1.0
    level_weights: list[np.ndarray | None] = [None]  # level 0's are in the level's vertex files
    for depth, (level, cluster) in enumerate(levels):
        count = top.size if depth + 1 == len(levels) else levels[depth + 1][0].size
        level_weights.append(_cluster_weights(scratch, level, cluster, level_weights[-1], count, len(names)))
    logger.info("METIS partitions %d clusters of %d nodes (their edges of weight >= %d: %.1f%% of the weight)",
                top.size, space.total, floor, 100 * kept)
    parts = engine.map("metis", _clusters_metis, [num_parts], None, None, scratch=scratch, level=top, floor=floor,
                       vweights=level_weights[-1], names=names, seed=seed)[0]
    load = part_loads(parts, level_weights[-1], num_parts)  # the same at every level: weights are sums
    refined = 0
    for (level, cluster), level_weight in zip(reversed(levels), reversed(level_weights[:-1])):
        parts = parts[np.asarray(cluster[:])]
        refined = refine_parts(engine, scratch, level, parts, level_weight, load, num_parts, TARGET, progress)
    balance = imbalance(load)
    logger.info("refinement moved %d nodes; balance now %s", refined, _describe(names, balance))
    if balance.max() > TARGET:
        logger.warning("partition unbalanced after refinement: %s", _describe(names, balance))
    return parts.astype(np.int32), {"metis_scheme": "kway", "metis_edge_fraction": round(kept, 6),
                                    "metis_coarse_vertices": top.size, "refined_nodes": refined}


def _cluster_weights(scratch: Scratch, level: Level, cluster: Any, weights: np.ndarray | None, count: int,
                     constraints: int) -> np.ndarray:
    """The (count, constraints) weights of the next level: each cluster's vertices' weights summed (level 0's
    read bucket by bucket from its vertex files, when ``weights`` is None)."""
    out = np.zeros((count, constraints), np.int64)
    for bucket in range(level.buckets):
        lo, hi = int(level.bounds[bucket]), int(level.bounds[bucket + 1])
        rows = level.vertex_weights(scratch, bucket) if weights is None else weights[lo:hi]
        owner = np.asarray(cluster[lo:hi])
        for c in range(constraints):
            out[:, c] += np.bincount(owner, weights=rows[:, c], minlength=count).astype(np.int64)
    return out


def _clusters_metis(num_parts: int, *, scratch: Scratch, level: Any, floor: int, vweights: np.ndarray,
                    names: list[str], seed: int) -> np.ndarray:
    """Stage ``metis`` on the coarse graph (edge weights: how many fine edges join two clusters).

    Clusters carry the constraints in uneven mixes, and label propagation may leave a fringe of tiny
    clusters beside full ones; no single way of calling METIS partitions every such graph well
    (measured on synthetic graphs: each of the three below cut 0.17-0.37 on some graph where another
    cut 0.150, the whole graph's figure). So all three run, each followed by the balanced refinement
    on this graph, and the balanced one that cuts the least edge weight wins: METIS with the
    constraints summed with equal say; METIS with every constraint (k-way, else recursive, then the
    repair); METIS on the core (clusters weighing at least 1/100 of the heaviest) with the fringe
    attached to the parts its edges lead to.
    """
    xadj, adjncy, adjwgt = load_level(scratch, level, floor)
    share = (vweights / np.maximum(vweights.mean(axis=0), 1e-12)).sum(axis=1)
    combined = np.maximum(1, np.round(share * 1000 / max(float(share.mean()), 1e-12))).astype(np.int64)
    candidates = [_run_metis(xadj, adjncy, adjwgt, combined[:, None], num_parts, seed, recursive=False),
                  _best_metis(xadj, adjncy, adjwgt, vweights, names, num_parts, seed)[0]]
    core = np.flatnonzero(share >= share.max() / 100)
    if 2 * num_parts <= len(core) < len(share):
        sub_x, sub_adj, sub_w = _induced(xadj, adjncy, adjwgt, core)
        parts = np.full(len(share), -1, np.int32)
        parts[core] = _best_metis(sub_x, sub_adj, sub_w, vweights[core], names, num_parts, seed)[0]
        attach_fringe(xadj, adjncy, adjwgt, parts, vweights, num_parts)
        candidates.append(parts)
    best = None
    for parts in candidates:
        parts = parts.astype(np.int32)
        refine_graph(xadj, adjncy, parts, vweights, num_parts, TARGET, adjwgt)
        owner = np.repeat(np.arange(len(xadj) - 1), np.diff(xadj))
        score = (max(float(imbalance(part_loads(parts, vweights, num_parts)).max()), TARGET),
                 float(adjwgt[parts[owner] != parts[adjncy]].sum()))
        if best is None or score < best[0]:
            best = (score, parts)
    return best[1]


def _induced(xadj: np.ndarray, adjncy: np.ndarray, adjwgt: np.ndarray,
             keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR of the subgraph induced by the vertices ``keep`` (renumbered ``0..len(keep)-1``)."""
    new = np.full(len(xadj) - 1, -1, np.int64)
    new[keep] = np.arange(len(keep))
    owner = np.repeat(np.arange(len(xadj) - 1), np.diff(xadj))
    inside = (new[owner] >= 0) & (new[adjncy] >= 0)
    counts = np.bincount(new[owner[inside]], minlength=len(keep))
    sub_x = np.zeros(len(keep) + 1, np.int64)
    np.cumsum(counts, out=sub_x[1:])
    return sub_x, new[adjncy[inside]], adjwgt[inside]


def attach_fringe(xadj: np.ndarray, adjncy: np.ndarray, adjwgt: np.ndarray, parts: np.ndarray,
                  weights: np.ndarray, num_parts: int) -> None:
    """Give every vertex without a part (-1) a part, in sweeps: each vertex linked to placed vertices
    goes, strongest link first, to the part its links lead to most that stays within the balance
    target in every constraint (else the least loaded one); vertices linked to none go last."""
    weight = weights.astype(np.float64)
    cap = weight.sum(axis=0) / num_parts * (TARGET - 1e-9)
    owner = np.repeat(np.arange(len(xadj) - 1), np.diff(xadj))
    for _ in range(64):
        todo = np.flatnonzero(parts < 0)
        if not len(todo):
            return
        placed = (parts[owner] < 0) & (parts[adjncy] >= 0)
        score = np.bincount(owner[placed] * num_parts + parts[adjncy[placed]], weights=adjwgt[placed],
                            minlength=len(parts) * num_parts).reshape(-1, num_parts)[todo]
        linked = score.max(axis=1) > 0
        if not linked.any():
            score, linked = np.zeros((len(todo), num_parts)), np.ones(len(todo), bool)
        order = np.argsort(-score.max(axis=1)[linked], kind="stable")
        load = part_loads(parts[parts >= 0], weight[parts >= 0], num_parts)
        _place(todo[linked][order], score[linked][order], parts, weight, load, cap)


def _place(vertices: np.ndarray, score: np.ndarray, parts: np.ndarray, weight: np.ndarray, load: np.ndarray,
           cap: np.ndarray) -> None:
    for v, row in zip(vertices, score):
        fits = (load + weight[v] <= cap).all(axis=1)
        choice = np.flatnonzero(fits)
        best = choice[np.argmax(row[choice])] if len(choice) else int(np.argmin((load / cap).max(axis=1)))
        parts[v] = best
        load[best] += weight[v]


def _report(parts: np.ndarray, weights: np.ndarray, names: list[str], num_parts: int, scheme: str,
            moved: int, what: str = "nodes") -> None:
    after = imbalance(part_loads(parts, weights, num_parts))
    if moved:
        logger.info("METIS (%s) missed balance %.2f; the repair moved %d %s (boundary first), now %s", scheme,
                    TARGET, moved, what, _describe(names, after))
    if after.max() > TARGET:
        logger.warning("partition still unbalanced after repair: %s", _describe(names, after))


def _best_metis(xadj: np.ndarray, adjncy: np.ndarray, adjwgt: np.ndarray | None, weights: np.ndarray,
                names: list[str], num_parts: int, seed: int) -> tuple[np.ndarray, str, int]:
    """k-way METIS, then the boundary repair; when k-way misses ``TARGET``, recursive bisection too.

    Multi-constraint k-way METIS leaves a plain random graph at 1.4 (two parts) where bisection
    balances it. Of the two (each repaired), the balanced one with the smaller cut wins.
    Returns the parts, the METIS scheme and how many nodes the repair moved.
    """
    parts = _run_metis(xadj, adjncy, adjwgt, weights, num_parts, seed, recursive=False)
    worst = imbalance(part_loads(parts, weights, num_parts))
    if worst.max() <= TARGET:
        return parts, "kway", 0
    logger.info("k-way METIS balance %s misses %.2f; trying recursive bisection", _describe(names, worst), TARGET)
    runs = []
    for scheme, got in (("kway", parts), ("recursive", _run_metis(xadj, adjncy, adjwgt, weights, num_parts, seed, True))):
        moved = rebalance(got, weights, xadj, adjncy, num_parts)
        worst = imbalance(part_loads(got, weights, num_parts)).max()
        runs.append((max(worst, TARGET), edge_cut(got, xadj, adjncy), scheme, got, moved))
    best = min(runs, key=lambda r: r[:2])
    return best[3], best[2], best[4]


def _run_metis(xadj: np.ndarray, adjncy: np.ndarray, adjwgt: np.ndarray | None, weights: np.ndarray,
               num_parts: int, seed: int, recursive: bool) -> np.ndarray:
    try:
        import pymetis
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ImportError("METIS partitioning needs pymetis: pip install pymetis") from exc
    dtype = pymetis.zero_copy_dtype()
    logger.info("METIS (%s): %d vertices, %d adjacency entries, %d constraints",
                "recursive" if recursive else "kway", len(xadj) - 1, len(adjncy), weights.shape[1])
    adjacency = pymetis.CSRAdjacency(xadj.astype(dtype, copy=False), adjncy.astype(dtype, copy=False))
    eweights = None if adjwgt is None else adjwgt.astype(dtype, copy=False)
    vweights, options = weights.astype(dtype, copy=False).ravel(), pymetis.Options(seed=seed)
    return run_parts(lambda: pymetis.part_graph(num_parts, adjacency, vweights=vweights, eweights=eweights,
                                                options=options, recursive=recursive), len(xadj) - 1)


def _describe(names: list[str], values: np.ndarray) -> str:
    return ", ".join(f"{n} {v:.3f}" for n, v in zip(names, values))


def vertex_weights(space: NodeSpace, train: dict[NodeType, np.ndarray],
                   in_degree: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The (total, constraints) METIS weights and their names: nodes of each type, train nodes, edges
    (:class:`~graphstore.ingest.adjacency.Constraints`, for a graph held in memory).

    The edge weight of a node is its in-degree in the stored edge lists (all of them, not METIS's
    sample, duplicates included), so balancing it balances the edges each partition stores.
    """
    constraints = Constraints.build(space, train, int(np.sum(in_degree)))
    return constraints.rows(0, space.total, in_degree), list(constraints.names)
