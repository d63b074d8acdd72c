"""Adapter: any in-memory :class:`GraphSource` as a :class:`ChunkedSource` of bounded, picklable chunks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, EdgeBlock
from graphstore.ingest.source import GraphSource, RowSource
from graphstore.dataset.types import EdgeType, NodeType


NODE_CHUNK_BYTES = 64 << 20  # node attribute bytes per node chunk, by default


@dataclass
class ArrayEdgeChunk:
    """Edges ``start..stop-1`` of one edge type: endpoint views, attributes read on demand.

    In this process nothing is copied; pickled (sent to a worker), the chunk carries only its own
    rows: its endpoint slices and its attribute rows, read from the sources at that moment.
    """

    etype: EdgeType
    start: int
    stop: int
    src: np.ndarray
    dst: np.ndarray
    attrs: dict[str, np.ndarray | RowSource]

    def _attr(self, value: np.ndarray | RowSource) -> np.ndarray:
        return value if isinstance(value, np.ndarray) else _rows(value, self.start, self.stop)

    def read(self) -> EdgeBlock:
        return EdgeBlock(self.src, self.dst, {n: self._attr(v) for n, v in self.attrs.items()}, self.start)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["src"], state["dst"] = np.array(self.src), np.array(self.dst)
        state["attrs"] = {n: self._attr(v) for n, v in self.attrs.items()}
        return state


@dataclass
class ArrayNodeChunk:
    """Attribute rows of node IDs ``start..stop-1`` of one node type, read from the sources on demand.

    In this process nothing is copied until :meth:`read`; pickled, the chunk carries only its rows.
    """

    ntype: NodeType
    start: int
    stop: int
    attrs: dict[str, np.ndarray | RowSource]

    def read(self, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = self.attrs if columns is None else [n for n in columns if n in self.attrs]
        return {n: self._attr(self.attrs[n]) for n in names}

    def _attr(self, value: np.ndarray | RowSource) -> np.ndarray:
        return value if isinstance(value, np.ndarray) else _rows(value, self.start, self.stop)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["attrs"] = {n: self._attr(v) for n, v in self.attrs.items()}
        return state


def _schema(rows: RowSource) -> ColumnSchema:
    return ColumnSchema(np.dtype(rows.dtype).name, tuple(int(n) for n in rows.shape[1:]))


def _rows(rows: RowSource, start: int, stop: int) -> np.ndarray:
    return np.asarray(rows.take(np.arange(start, stop, dtype=np.int64)))


def chunked_from_graph(source: GraphSource, chunk_edges: int, chunk_nodes: int | None = None) -> ChunkedSource:
    """Cut ``source`` into edge chunks of at most ``chunk_edges`` edges and node chunks of ``chunk_nodes`` rows
    (default: about :data:`NODE_CHUNK_BYTES` of attribute rows).

    Every existing reader (planetoid, ogb, npz, pyg, in-memory) thereby feeds the chunked pipeline.
    Chunks of one edge type cover ``0..num_edges-1`` in input order, so edge IDs are the same as
    in ``source``.

    Examples
    --------
    >>> from graphstore.ingest.source import EdgeTable, GraphSource, NodeTable
    >>> g = GraphSource({None: NodeTable(3)}, {None: EdgeTable(np.array([0, 1, 2]), np.array([1, 2, 0]))})
    >>> [(c.start, c.stop) for c in chunked_from_graph(g, 2).edge_chunks]
    [(0, 2), (2, 3)]
    """
    for name, value in (("chunk_edges", chunk_edges), ("chunk_nodes", chunk_nodes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidInputError(f"{name}={value!r} must be a positive int (rows per chunk)")
    row_bytes = {t: sum(np.dtype(r.dtype).itemsize * int(np.prod(r.shape[1:])) for r in n.attrs.values())
                 for t, n in source.nodes.items()}
    edge_chunks: list[ArrayEdgeChunk] = []
    for etype, table in source.edges.items():
        for start in range(0, table.num_edges, chunk_edges):
            stop = min(start + chunk_edges, table.num_edges)
            edge_chunks.append(ArrayEdgeChunk(
                etype, start, stop, np.asarray(table.src[start:stop]), np.asarray(table.dst[start:stop]),
                dict(table.attrs)))
    node_chunks: list[ArrayNodeChunk] = []
    for ntype, nodes in source.nodes.items():
        step = chunk_nodes or max(1 << 12, NODE_CHUNK_BYTES // max(1, row_bytes[ntype]))
        for start in range(0, nodes.num_nodes, step):
            stop = min(start + step, nodes.num_nodes)
            node_chunks.append(ArrayNodeChunk(ntype, start, stop, dict(nodes.attrs)))
    return ChunkedSource(
        num_nodes={t: n.num_nodes for t, n in source.nodes.items()},
        node_schema={t: {k: _schema(r) for k, r in n.attrs.items()} for t, n in source.nodes.items()},
        num_edges={t: e.num_edges for t, e in source.edges.items()},
        edge_schema={t: {k: _schema(r) for k, r in e.attrs.items()} for t, e in source.edges.items()},
        edge_chunks=edge_chunks, node_chunks=node_chunks, name=source.name, origin=source.origin)
