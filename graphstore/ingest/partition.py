"""Assign every node to a partition: METIS (balanced nodes, train nodes and edges), random, or range."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.source import GraphSource, NodeType

logger = logging.getLogger(__name__)

METHODS = ("metis", "random", "range")
Progress = Callable[[str, int, int], None]


def partition_nodes(source: GraphSource, num_parts: int, method: str, seed: int = 0,
                    progress: Progress | None = None) -> dict[NodeType, np.ndarray]:
    """Return, per node type, the partition (int32) of every input node.

    Heterogeneous graphs are partitioned on their homogeneous view; each type keeps its own IDs.

    Examples
    --------
    >>> from graphstore.ingest.source import EdgeTable, GraphSource, NodeTable
    >>> g = GraphSource({None: NodeTable(4)}, {None: EdgeTable(np.array([0, 1]), np.array([1, 2]))})
    >>> partition_nodes(g, 2, "range")[None].tolist()
    [0, 0, 1, 1]
    """
    if method not in METHODS:
        raise InvalidInputError(f"partition method {method!r} is not one of {METHODS}; pass --method metis|random|range")
    if num_parts == 1:
        return {t: np.zeros(n.num_nodes, np.int32) for t, n in source.nodes.items()}
    if method == "range":
        return {t: _range_parts(n.num_nodes, num_parts) for t, n in source.nodes.items()}
    if method == "random":
        rng = np.random.default_rng(seed)
        return {t: _range_parts(n.num_nodes, num_parts)[rng.permutation(n.num_nodes)] for t, n in source.nodes.items()}
    return _metis(source, num_parts, seed, progress)


def _range_parts(num_nodes: int, num_parts: int) -> np.ndarray:
    return (np.arange(num_nodes, dtype=np.int64) * num_parts // max(num_nodes, 1)).astype(np.int32)


def _homogeneous_offsets(source: GraphSource) -> dict[NodeType, int]:
    offsets, total = {}, 0
    for ntype, table in source.nodes.items():
        offsets[ntype] = total
        total += table.num_nodes
    return offsets


def symmetric_adjacency(source: GraphSource, offsets: dict[NodeType, int], total: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (xadj, adjncy) of the undirected homogeneous view, without self-loops or duplicates."""
    keys = []
    for etype, table in source.edges.items():
        s_type, d_type = (None, None) if etype is None else (etype[0], etype[2])
        u = table.src.astype(np.int64) + offsets[s_type]
        v = table.dst.astype(np.int64) + offsets[d_type]
        keep = u != v
        u, v = u[keep], v[keep]
        keys.append(u * total + v)
        keys.append(v * total + u)
        del u, v, keep
    key = np.unique(np.concatenate(keys))
    del keys
    adjncy = key % total
    xadj = np.zeros(total + 1, np.int64)
    np.cumsum(np.bincount(key // total, minlength=total), out=xadj[1:])
    return xadj, adjncy


def _metis(source: GraphSource, num_parts: int, seed: int, progress: Progress | None) -> dict[NodeType, np.ndarray]:
    try:
        import pymetis
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ImportError("METIS partitioning needs pymetis: pip install pymetis") from exc
    offsets = _homogeneous_offsets(source)
    total = sum(t.num_nodes for t in source.nodes.values())
    if progress:
        progress("partition", 0, 3)
    xadj, adjncy = symmetric_adjacency(source, offsets, total)
    if progress:
        progress("partition", 1, 3)
    weights = _vertex_weights(source, offsets, total, xadj)
    options = pymetis.Options(seed=seed)
    dtype = pymetis.zero_copy_dtype()
    logger.info("METIS: %d vertices, %d adjacency entries, %d constraints", total, len(adjncy),
                len(weights) // max(total, 1))
    result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj.astype(dtype), adjncy.astype(dtype)),
                                vweights=weights.astype(dtype), options=options)
    del xadj, adjncy
    parts = np.asarray(result[1], dtype=np.int32)
    if progress:
        progress("partition", 3, 3)
    return {t: parts[offsets[t]: offsets[t] + n.num_nodes] for t, n in source.nodes.items()}


def _vertex_weights(source: GraphSource, offsets: dict[NodeType, int], total: int, xadj: np.ndarray) -> np.ndarray:
    """Multi-constraint weights: one per node type (balance nodes), train nodes, and degree (edges)."""
    columns = []
    for ntype, table in source.nodes.items():
        col = np.zeros(total, np.int64)
        col[offsets[ntype]: offsets[ntype] + table.num_nodes] = 1
        columns.append(col)
    train = np.zeros(total, np.int64)
    for ntype, table in source.nodes.items():
        if "train_mask" in table.attrs:
            mask = table.attrs["train_mask"].take(np.arange(table.num_nodes))
            train[offsets[ntype]: offsets[ntype] + table.num_nodes] = mask.astype(bool)
    if train.any():
        columns.append(train)
    columns.append(np.diff(xadj) + 1)
    return np.stack(columns, axis=1).ravel()
