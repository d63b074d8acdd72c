"""The symmetric adjacency METIS partitions, built from edge chunks in bounded buckets on any engine.

Stage ``adjacency``: each edge chunk is checked and its edges, in both directions, are written to
the bucket owning their destination (buckets are ranges of the homogeneous node IDs). Stage
``degrees``: each bucket is sorted and deduplicated into a CSR piece on disk (self-loops dropped,
as METIS wants), beside the METIS weights of its nodes (:class:`Constraints`), and returns each
node's degree and combined weight (8 bytes a node: all the client keeps of the graph). METIS then reads
the pieces (:func:`load_adjacency`) or, when they would not fit a task, a coarsened graph (``coarsen.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphstore.ingest.chunks import EdgeChunk
from graphstore.ingest.scratch import Scratch
from graphstore.ingest.validate import read_edge_block
from graphstore.dataset.types import EdgeType, NodeType

_BLOCK = 1 << 23


@dataclass(frozen=True)
class NodeSpace:
    """The homogeneous view of every node type, cut into buckets of consecutive IDs.

    Node ``i`` of type ``t`` is ``offsets[t] + i``; bucket ``b`` holds ``[bounds[b], bounds[b + 1])``.
    """

    offsets: dict[NodeType, int]
    num_nodes: dict[NodeType, int]
    total: int
    bounds: np.ndarray

    @classmethod
    def build(cls, num_nodes: dict[NodeType, int], buckets: int) -> NodeSpace:
        offsets, total = {}, 0
        for ntype, count in num_nodes.items():
            offsets[ntype] = total
            total += count
        buckets = max(1, min(buckets, total))
        bounds = (np.arange(buckets + 1, dtype=np.int64) * total) // buckets
        return cls(offsets, dict(num_nodes), total, bounds)

    @property
    def buckets(self) -> int:
        return len(self.bounds) - 1

    def bucket_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, ids, side="right") - 1

    def ends(self, etype: EdgeType) -> tuple[NodeType, NodeType]:
        return (None, None) if etype is None else (etype[0], etype[2])

    def id_dtype(self) -> np.dtype:
        return np.dtype(np.int32) if self.total < 2**31 else np.dtype(np.int64)

    @property
    def level(self) -> Level:
        """The deduplicated adjacency written by stage ``degrees``, as level 0 of the coarsening."""
        return Level("csr", self.bounds, "vtx")


@dataclass(frozen=True)
class Constraints:
    """What METIS balances, one column each: the nodes of every type, train nodes, stored edges.

    A node weighs 1 in its type's column, its train flag in ``train_nodes`` and its stored in-degree (every
    edge list, duplicates included) in ``edges``, so balancing that column balances the edges each
    partition stores. Tasks compute the rows of their own nodes; nothing node-sized but the packed
    train flags (1 bit a node) travels.
    """

    names: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]  # homogeneous ID range of each node type's column
    train: np.ndarray | None  # packed train flags over the homogeneous IDs; None: no train column
    edges: bool  # whether there is an ``edges`` column
    means: tuple[float, ...]  # each column's mean over every node

    @classmethod
    def build(cls, space: NodeSpace, train: dict[NodeType, np.ndarray], num_edges: int) -> Constraints:
        names, bounds, means = [], [], []
        for ntype, count in space.num_nodes.items():
            names.append("nodes" if ntype is None else f"nodes[{ntype}]")
            bounds.append((space.offsets[ntype], space.offsets[ntype] + count))
            means.append(count / max(space.total, 1))
        flags = np.zeros(space.total, bool)
        for ntype, mask in train.items():
            flags[space.offsets[ntype]: space.offsets[ntype] + space.num_nodes[ntype]] = mask
        trained = int(np.count_nonzero(flags))
        if trained:
            names.append("train_nodes")
            means.append(trained / space.total)
        if num_edges:
            names.append("edges")
            means.append(num_edges / space.total)
        return cls(tuple(names), tuple(bounds), np.packbits(flags) if trained else None, bool(num_edges),
                   tuple(means))

    def rows(self, lo: int, hi: int, in_degree: np.ndarray) -> np.ndarray:
        """The (hi - lo, constraints) int64 weights of nodes ``lo..hi-1`` of stored in-degrees ``in_degree``."""
        out = np.zeros((hi - lo, len(self.names)), np.int64)
        for c, (a, b) in enumerate(self.bounds):
            out[max(a, lo) - lo: max(min(b, hi) - lo, 0), c] = 1
        c = len(self.bounds)
        if self.train is not None:
            first = lo // 8
            bits = np.unpackbits(self.train[first: (hi + 7) // 8])
            out[:, c] = bits[lo - 8 * first: hi - 8 * first]
            c += 1
        if self.edges:
            out[:, c] = in_degree
        return out

    def share(self, rows: np.ndarray) -> np.ndarray:
        """Each node's weights summed with every constraint an equal say (each over its mean), as float32."""
        return (rows / np.maximum(np.array(self.means), 1e-12)).sum(axis=1).astype(np.float32)


def bucket_edges(item: tuple[int, EdgeChunk], *, scratch: Scratch, space: NodeSpace, keep_ends: bool = False
                 ) -> list[int]:
    """Stage ``adjacency``: check one edge chunk and write its edges, both directions, to their buckets.

    A file per (bucket, chunk) holds ``dst`` (relative to the bucket), ``src`` and ``fwd`` (the entry
    is the stored direction: it counts towards the in-degree). A self-loop is written once. Returns
    the entries written to each bucket. With ``keep_ends``, a chunk without edge attributes also leaves
    its endpoints in ``ends/<chunk>`` (8 bytes an edge), which stage ``route`` reads instead of the source.
    """
    index, chunk = item
    s_type, d_type = space.ends(chunk.etype)
    block = read_edge_block(chunk, space.num_nodes[s_type], space.num_nodes[d_type])
    if keep_ends and not block.attrs:
        narrow = np.int32 if max(space.num_nodes[s_type], space.num_nodes[d_type]) < 2**31 else np.int64
        scratch.put(f"ends/{index:06d}", {"src": np.asarray(block.src).astype(narrow),
                                          "dst": np.asarray(block.dst).astype(narrow)})
    u = np.asarray(block.src, np.int64) + space.offsets[s_type]
    v = np.asarray(block.dst, np.int64) + space.offsets[d_type]
    back = u != v
    dst = np.concatenate([v, u[back]])
    src = np.concatenate([u, v[back]])
    fwd = np.zeros(len(dst), bool)
    fwd[:len(v)] = True
    del u, v, back
    bucket = space.bucket_of(dst)
    order = np.argsort(bucket, kind="stable")
    cuts = np.searchsorted(bucket[order], np.arange(space.buckets + 1))
    counts = []
    for b in range(space.buckets):
        sel = order[cuts[b]: cuts[b + 1]]
        counts.append(len(sel))
        if len(sel):
            scratch.put(f"adj/{b:05d}/{index:06d}", {
                "dst": (dst[sel] - space.bounds[b]).astype(np.uint32), "src": src[sel].astype(space.id_dtype()),
                "fwd": fwd[sel]})
    return counts


@dataclass
class BucketDegrees:
    """What a bucket's deduplication found: its CSR entries, and per node its degree and combined weight."""

    entries: int  # distinct neighbour entries (both directions, no self-loops)
    degree: np.ndarray  # int32: each node's distinct neighbours (its degree in the graph METIS sees)
    share: np.ndarray  # float32: each node's METIS weights combined (Constraints.share)


def bucket_degrees(bucket: int, *, scratch: Scratch, space: NodeSpace, constraints: Constraints) -> BucketDegrees:
    """Stage ``degrees``: sort and deduplicate one bucket into its CSR piece ``csr/<bucket>``, and write the
    METIS weights of its nodes to ``vtx/<bucket>``."""
    lo, hi = int(space.bounds[bucket]), int(space.bounds[bucket + 1])
    data = scratch.concat(f"adj/{bucket:05d}", {"dst": np.uint32, "src": space.id_dtype(), "fwd": np.bool_})
    dst = data["dst"].astype(np.int64)
    rows = constraints.rows(lo, hi, np.bincount(dst[data["fwd"]], minlength=hi - lo))
    scratch.put(f"vtx/{bucket:05d}", {"weights": rows.astype(np.int32 if rows.max(initial=0) < 2**31 else np.int64)})
    keep = dst + lo != data["src"]
    key = dst[keep] * space.total + data["src"][keep]
    del data, dst, keep
    key.sort()
    distinct = np.ones(len(key), bool)
    np.not_equal(key[1:], key[:-1], out=distinct[1:])
    key = key[distinct]
    counts = np.bincount(key // space.total, minlength=hi - lo).astype(np.int64)
    scratch.put(f"csr/{bucket:05d}", {"counts": counts, "adjncy": (key % space.total).astype(space.id_dtype())})
    return BucketDegrees(len(key), counts.astype(np.int32), constraints.share(rows))


@dataclass(frozen=True)
class Level:
    """A graph on disk: pieces ``<prefix>/<bucket>`` over vertices ``[bounds[b], bounds[b + 1])``, and when
    ``vertices`` is set, each bucket's vertex weights in ``<vertices>/<bucket>`` (level 0's METIS weights)."""

    prefix: str
    bounds: np.ndarray
    vertices: str | None = None

    @property
    def size(self) -> int:
        return int(self.bounds[-1])

    @property
    def buckets(self) -> int:
        return len(self.bounds) - 1

    def piece(self, scratch: Scratch, bucket: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(indptr, adjncy, weight)`` of one bucket (``weight`` ``None``: every edge weighs 1)."""
        piece = scratch.load(scratch.keys(f"{self.prefix}/{bucket:05d}")[0])
        indptr = np.zeros(len(piece["counts"]) + 1, np.int64)
        np.cumsum(piece["counts"], out=indptr[1:])
        return indptr, piece["adjncy"], piece.get("weight")

    def vertex_weights(self, scratch: Scratch, bucket: int) -> np.ndarray:
        """The (vertices, constraints) int64 weights of one bucket's vertices (a level with ``vertices``)."""
        return scratch.load(scratch.keys(f"{self.vertices}/{bucket:05d}")[0])["weights"].astype(np.int64)


def keep_undirected(key: np.ndarray, total: int, fraction: float, seed: int) -> np.ndarray:
    """A keep-mask choosing each undirected edge with probability ``fraction``, both directions alike.

    ``key`` holds ``u * total + v``; the draw is splitmix64 of ``(min, max)`` salted by ``seed``.
    """
    keep = np.empty(len(key), bool)
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    salt = np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64)
    for start in range(0, len(key), _BLOCK):
        block = key[start: start + _BLOCK]
        a, b = block // total, block % total
        z = (np.minimum(a, b) * total + np.maximum(a, b)).astype(np.uint64) ^ salt
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        keep[start: start + len(block)] = (z ^ (z >> np.uint64(31))) < threshold
    return keep


def load_adjacency(scratch: Scratch, space: NodeSpace, entries: int, max_edges: int | None,
                   seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The whole symmetric CSR ``(xadj, adjncy)`` from the pieces, and the fraction of edges kept.

    With more than ``max_edges`` undirected edges, a uniform random subset of about ``max_edges`` is
    kept (both directions of an edge together), as :func:`keep_undirected` draws it.
    """
    fraction = 1.0
    if max_edges is not None and entries > 2 * max_edges:
        fraction = 2 * max_edges / entries
    counts, adjncy = [], []
    for bucket in range(space.buckets):
        indptr, adj, _ = space.level.piece(scratch, bucket)
        adj = adj.astype(np.int64)
        if fraction < 1.0:
            lo = int(space.bounds[bucket])
            dst = np.repeat(np.arange(lo, lo + len(indptr) - 1, dtype=np.int64), np.diff(indptr))
            keep = keep_undirected(dst * space.total + adj, space.total, fraction, seed)
            counts.append(np.bincount(dst[keep] - lo, minlength=len(indptr) - 1))
            adj = adj[keep]
        else:
            counts.append(np.diff(indptr))
        adjncy.append(adj)
    xadj = np.zeros(space.total + 1, np.int64)
    np.cumsum(np.concatenate(counts), out=xadj[1:])
    return xadj, np.concatenate(adjncy) if adjncy else np.zeros(0, np.int64), fraction
