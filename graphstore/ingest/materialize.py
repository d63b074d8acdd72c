"""Read a ChunkedSource whole into one in-memory GraphSource (the reverse of ``chunked_graph.py``)."""

from __future__ import annotations

import logging

import numpy as np

from graphstore.ingest.chunks import ChunkedSource, ColumnSchema
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable, RowSource
from graphstore.dataset.types import EdgeType, NodeType

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
