"""The ``synthetic:`` graph as bounded chunks, each a pure function of (spec, chunk number).

Per-node values (community, degree weight) come in fixed blocks of :data:`NODE_BLOCK` nodes seeded
by ``(seed, block)``; the undirected edges in fixed chunks of :data:`EDGE_CHUNK` seeded by
``(seed, chunk)``; masks from a keyed bijection of ``0..N-1`` (exact split sizes without a global
permutation); features from a hash of ``(key, node, column)``. So the graph depends on the seed
only, never on which process reads which chunk, or in which order.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, EdgeBlock, process_cache
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.ingest.synthetic import (CENTROID_SCALE, COMMUNITIES_PER_CLASS, GOLDEN, PARETO_SHAPE,
                                         SyntheticFeatures, SyntheticSpec, Communities, mix64, feature_rows)

NODE_BLOCK = 1 << 16  # nodes per random block (part of the generator's definition: never change it)
EDGE_CHUNK = 1 << 20  # undirected edges per edge chunk (likewise): 2**21 directed edges, ~100 MB to draw
NODE_CHUNK: int | None = None  # nodes per NodeChunk (None: NODE_BLOCK multiples of about NODE_CHUNK_BYTES of
NODE_CHUNK_BYTES = 64 << 20  # attribute rows); only the work split depends on it
_NODES, _EDGES, _SPLIT, _FEATURES, _KEY = range(5)  # stream tags
_FEISTEL_ROUNDS = 4
MASKS = ("train_mask", "val_mask", "test_mask")
logger = logging.getLogger(__name__)


def _stream(spec: SyntheticSpec, tag: int, number: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([spec.seed, tag, number]))


def _node_block(spec: SyntheticSpec, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``(community, degree weight)`` of the nodes of random block ``block``."""
    rng = _stream(spec, _NODES, block)
    size = min(NODE_BLOCK, spec.nodes - block * NODE_BLOCK)
    community = rng.integers(0, spec.classes * COMMUNITIES_PER_CLASS, size, dtype=np.int64)
    return community, np.minimum(rng.pareto(PARETO_SHAPE, size) + 1.0, math.sqrt(spec.nodes))  # tame a freak hub


def synthetic_nodes(spec: SyntheticSpec, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``(community, degree weight)`` of nodes ``lo..hi-1``, drawn block by block."""
    first, last = lo // NODE_BLOCK, (hi - 1) // NODE_BLOCK if hi > lo else lo // NODE_BLOCK - 1
    community, weights = [np.empty(0, np.int64)], [np.empty(0)]
    for block in range(first, last + 1):
        c, w = _node_block(spec, block)
        community.append(c)
        weights.append(w)
    offset = lo - first * NODE_BLOCK
    return np.concatenate(community)[offset:offset + hi - lo], np.concatenate(weights)[offset:offset + hi - lo]


@process_cache
@functools.lru_cache(maxsize=2)
def _groups(spec: SyntheticSpec) -> Communities:
    """The community tables edges are drawn from (12 bytes a node, once per process; the engines clear them
    after every stage). Filled block by block: no node-sized temporary beyond the weights and the sort."""
    count = spec.classes * COMMUNITIES_PER_CLASS
    community = np.empty(spec.nodes, np.min_scalar_type(count))
    weights = np.empty(spec.nodes, np.float64)
    for block in range(-(-spec.nodes // NODE_BLOCK)):
        lo = block * NODE_BLOCK
        c, w = _node_block(spec, block)
        community[lo: lo + len(c)], weights[lo: lo + len(w)] = c, w
    return Communities.build(community, weights, count, keep_community=False)


def _feistel(x: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    """A keyed bijection of ``0..4**half - 1`` (balanced Feistel network over two ``half``-bit halves)."""
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    left, right = x >> shift, x & mask
    for key in keys:
        mixed = (right ^ key) * GOLDEN
        left, right = right, left ^ (mix64(mixed) & mask)
    return (left << shift) | right


def split_positions(spec: SyntheticSpec, ids: np.ndarray) -> np.ndarray:
    """Each node's place in a seeded random permutation of ``0..N-1`` (cycle-walking a Feistel bijection)."""
    half = max(1, ((spec.nodes - 1).bit_length() + 1) // 2)
    keys = np.random.SeedSequence([spec.seed, _SPLIT, 0]).generate_state(_FEISTEL_ROUNDS, dtype=np.uint64)
    x = ids.astype(np.uint64)
    todo = np.arange(len(x))
    while todo.size:
        x[todo] = _feistel(x[todo], keys, half)
        todo = todo[x[todo] >= np.uint64(spec.nodes)]
    return x.astype(np.int64)


def split_masks(spec: SyntheticSpec, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Disjoint train/val/test masks of nodes ``ids``: exactly ``round(fraction * nodes)`` train and val."""
    n_train = round(spec.train * spec.nodes)
    n_val = min(round(spec.val * spec.nodes), spec.nodes - n_train)
    pos = split_positions(spec, ids)
    return {"train_mask": pos < n_train, "val_mask": (pos >= n_train) & (pos < n_train + n_val),
            "test_mask": pos >= n_train + n_val}


def feature_params(spec: SyntheticSpec) -> tuple[np.ndarray, int, float]:
    """``(class centroids, hash key, noise)`` of the features."""
    scale = CENTROID_SCALE / math.sqrt(spec.features)
    centroids = _stream(spec, _FEATURES, 0).normal(0.0, scale, (spec.classes, spec.features)).astype(np.float32)
    key = int(np.random.SeedSequence([spec.seed, _KEY, 0]).generate_state(1, dtype=np.uint64)[0])
    return centroids, key, spec.noise


@dataclass
class SyntheticEdgeChunk:
    """Undirected edges ``[lo, hi)`` as directed edges ``[2 lo, 2 hi)``: the pairs, then their reverses."""

    spec: SyntheticSpec
    number: int
    start: int
    stop: int
    etype: None = None

    def read(self) -> EdgeBlock:
        u, v = _groups(self.spec).sample_pairs(_stream(self.spec, _EDGES, self.number), (self.stop - self.start) // 2,
                                               self.spec.homophily)
        return EdgeBlock(np.concatenate([u, v]), np.concatenate([v, u]), {}, self.start)


@dataclass
class SyntheticNodeChunk:
    """Labels, masks and features of nodes ``[start, stop)``."""

    spec: SyntheticSpec
    start: int
    stop: int
    ntype: None = None

    def read(self, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        want = set(("y", "x", *MASKS) if columns is None else columns)
        ids = np.arange(self.start, self.stop, dtype=np.int64)
        labels = synthetic_nodes(self.spec, self.start, self.stop)[0] % self.spec.classes
        out = {"y": labels, **split_masks(self.spec, ids)} if want & {"y", *MASKS} else {}
        if self.spec.features > 0 and "x" in want:
            centroids, key, noise = feature_params(self.spec)
            out["x"] = feature_rows(ids, labels, centroids, np.uint64(key), np.float32(noise))
        return {name: values for name, values in out.items() if name in want}


def edge_chunks(spec: SyntheticSpec) -> list[SyntheticEdgeChunk]:
    half = spec.num_edges // 2
    return [SyntheticEdgeChunk(spec, k, 2 * lo, 2 * min(lo + EDGE_CHUNK, half))
            for k, lo in enumerate(range(0, half, EDGE_CHUNK))]


def synthetic_chunked(spec: SyntheticSpec) -> ChunkedSource:
    """The graph of :func:`~graphstore.ingest.synthetic.synthetic_graph` as a :class:`ChunkedSource`.

    Examples
    --------
    >>> from graphstore.ingest.synthetic import parse_synthetic_spec
    >>> c = synthetic_chunked(parse_synthetic_spec("nodes=100,avg_degree=4,features=8"))
    >>> c.num_edges, c.edge_chunks[0].read().src.shape
    ({None: 400}, (400,))
    """
    schema = {"y": ColumnSchema("<i8"), **{m: ColumnSchema("|b1") for m in MASKS}}
    if spec.features > 0:
        schema["x"] = ColumnSchema("<f4", (spec.features,))
    step = NODE_CHUNK or max(NODE_BLOCK, (NODE_CHUNK_BYTES // (4 * spec.features + 12)) // NODE_BLOCK * NODE_BLOCK)
    nodes = [SyntheticNodeChunk(spec, lo, min(lo + step, spec.nodes)) for lo in range(0, spec.nodes, step)]
    return ChunkedSource({None: spec.nodes}, {None: schema}, {None: spec.num_edges}, {None: {}},
                         list(edge_chunks(spec)), list(nodes), name="synthetic", origin=spec.to_string())


def read_edges(spec: SyntheticSpec, progress: Callable[[int, int], None] | None) -> tuple[np.ndarray, np.ndarray]:
    """All directed edges, chunk by chunk into two int64 arrays (``progress(done, total)`` per chunk)."""
    src, dst = np.empty(spec.num_edges, np.int64), np.empty(spec.num_edges, np.int64)
    for chunk in edge_chunks(spec):
        block = chunk.read()
        src[chunk.start:chunk.stop], dst[chunk.start:chunk.stop] = block.src, block.dst
        if progress is not None:
            progress(chunk.stop, spec.num_edges)
    _groups.cache_clear()  # this process has drawn every edge: free the community tables
    return src, dst


def synthetic_graph(spec: SyntheticSpec, *, progress: Callable[[int, int], None] | None = None) -> GraphSource:
    """Generate the homogeneous graph ``spec`` describes, deterministically from ``spec.seed``.

    Degrees follow Pareto weights (heavy tail, capped at ``sqrt(nodes)`` times the minimum); every
    node joins one of ``classes * 4`` planted communities and is labelled ``community % classes``.
    Each undirected edge joins a weight-sampled node to a weight-sampled partner from its own
    community with probability ``homophily`` (else from anywhere) and is stored in both directions.
    Self-loops and duplicates can occur. ``x`` is a lazy :class:`SyntheticFeatures`, the rest arrays.
    Every value comes from chunks seeded by ``(seed, chunk number)``
    (:func:`~graphstore.ingest.synthetic_chunks.synthetic_chunked`), so the Dask engine, reading the
    same chunks in any order on any worker, generates the same graph.

    Parameters
    ----------
    spec : SyntheticSpec
        The parameters, e.g. from :func:`parse_synthetic_spec`.
    progress : callable, optional
        Called as ``progress(done, total)`` in directed edges while edges are drawn.

    Returns
    -------
    GraphSource
        Named ``"synthetic"``, with ``origin`` the canonical spec string.

    Examples
    --------
    >>> g = synthetic_graph(parse_synthetic_spec("nodes=1000,avg_degree=6,features=16,classes=4"))
    >>> g.edges[None].num_edges, g.nodes[None].attrs["x"].shape
    (6000, (1000, 16))
    """
    src, dst = read_edges(spec, progress)
    labels = synthetic_nodes(spec, 0, spec.nodes)[0] % spec.classes
    masks = split_masks(spec, np.arange(spec.nodes, dtype=np.int64))
    attrs = {"y": ArrayRows(labels), **{name: ArrayRows(mask) for name, mask in masks.items()}}
    if spec.features > 0:
        attrs["x"] = SyntheticFeatures(labels, *feature_params(spec))
    logger.info("synthetic graph: %d nodes, %d directed edges, %d features", spec.nodes, len(src), spec.features)
    return GraphSource(
        nodes={None: NodeTable(num_nodes=spec.nodes, attrs=attrs)},
        edges={None: EdgeTable(src=src, dst=dst)},
        name="synthetic",
        origin=spec.to_string(),
    )
