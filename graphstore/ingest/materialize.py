"""Between the two source shapes: read a ChunkedSource whole, or wrap an in-memory GraphSource as chunks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, EdgeBlock
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable, RowSource
from graphstore.types import EdgeType, NodeType

logger = logging.getLogger(__name__)


def materialize(chunked: ChunkedSource) -> GraphSource:
    """Read every chunk of ``chunked`` in this process into one in-memory :class:`GraphSource`.

    Holds all edges and node rows at once (what the in-process pipeline needs); chunks are placed at
    their ``start`` so the result does not depend on chunk order. ``chunked``'s cleanups move to the
    result, which closes them.

    Examples
    --------
    >>> from graphstore.ingest.synthetic import parse_synthetic_spec
    >>> from graphstore.ingest.synthetic_chunks import synthetic_chunked
    >>> g = materialize(synthetic_chunked(parse_synthetic_spec("nodes=100,avg_degree=4,features=8")))
    >>> g.edges[None].num_edges, g.nodes[None].attrs["x"].shape
    (400, (100, 8))
    """
    nodes = {t: NodeTable(n, _node_attrs(chunked, t)) for t, n in chunked.num_nodes.items()}
    edges = {t: _edge_table(chunked, t) for t in chunked.num_edges}
    source = GraphSource(nodes, edges, name=chunked.name, origin=chunked.origin, cleanups=list(chunked.cleanups))
    chunked.cleanups.clear()
    return source


def _empty(schema: ColumnSchema, rows: int) -> np.ndarray:
    return np.empty((rows, *schema.shape), dtype=np.dtype(schema.dtype))


def _node_attrs(chunked: ChunkedSource, ntype: NodeType) -> dict[str, RowSource]:
    schema = chunked.node_schema.get(ntype, {})
    out = {name: _empty(s, chunked.num_nodes[ntype]) for name, s in schema.items()}
    for chunk in chunked.node_chunks:
        if chunk.ntype == ntype:
            for name, rows in chunk.read().items():
                out[name][chunk.start:chunk.stop] = rows
    return {name: ArrayRows(array) for name, array in out.items()}


def _edge_table(chunked: ChunkedSource, etype: EdgeType) -> EdgeTable:
    count = chunked.num_edges[etype]
    src, dst = np.empty(count, np.int64), np.empty(count, np.int64)
    attrs = {name: _empty(s, count) for name, s in chunked.edge_schema.get(etype, {}).items()}
    for chunk in chunked.edge_chunks:
        if chunk.etype == etype:
            block = chunk.read()
            src[chunk.start:chunk.stop], dst[chunk.start:chunk.stop] = block.src, block.dst
            for name, rows in block.attrs.items():
                attrs[name][chunk.start:chunk.stop] = rows
    return EdgeTable(src, dst, {name: ArrayRows(a) for name, a in attrs.items()})


@dataclass
class WholeEdges:
    """All edges of one type of an in-memory source as a single chunk (for readers without chunking)."""

    table: EdgeTable
    start: int
    stop: int
    etype: EdgeType = None

    def read(self) -> EdgeBlock:
        every = np.arange(self.table.num_edges)
        attrs = {name: rows.take(every) for name, rows in self.table.attrs.items()}
        return EdgeBlock(np.asarray(self.table.src, np.int64), np.asarray(self.table.dst, np.int64), attrs, 0)


@dataclass
class WholeNodes:
    """All node rows of one type of an in-memory source as a single chunk."""

    table: NodeTable
    start: int
    stop: int
    ntype: NodeType = None

    def read(self) -> dict[str, np.ndarray]:
        every = np.arange(self.table.num_nodes)
        return {name: rows.take(every) for name, rows in self.table.attrs.items()}


def chunked_whole(source: GraphSource, scheme: str) -> ChunkedSource:
    """``source`` as a :class:`ChunkedSource` of one chunk per type, read whole (logged, naming ``scheme``).

    A stand-in until the pipeline's generic adapter: the single chunk holds the whole graph.
    """
    logger.warning("SOURCE %s cannot be read in chunks yet: it is read whole into one process", scheme)

    def schema(rows: RowSource) -> ColumnSchema:
        return ColumnSchema(np.dtype(rows.dtype).str, tuple(rows.shape[1:]))

    return ChunkedSource(
        num_nodes={t: n.num_nodes for t, n in source.nodes.items()},
        node_schema={t: {k: schema(v) for k, v in n.attrs.items()} for t, n in source.nodes.items()},
        num_edges={t: e.num_edges for t, e in source.edges.items()},
        edge_schema={t: {k: schema(v) for k, v in e.attrs.items()} for t, e in source.edges.items()},
        edge_chunks=[WholeEdges(e, 0, e.num_edges, t) for t, e in source.edges.items()],
        node_chunks=[WholeNodes(n, 0, n.num_nodes, t) for t, n in source.nodes.items()],
        name=source.name, origin=source.origin, cleanups=source.cleanups,
    )
