"""Turn what a user names as SOURCE (a string or a PyG object) into a :class:`GraphSource`."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from graphstore.errors import SourceNotFoundError, UnknownSourceError
from graphstore.ingest.chunks import ChunkedSource, EdgeBlock
from graphstore.ingest.source import GraphSource

logger = logging.getLogger(__name__)
_GENERATED = ("synthetic", "synthetic-mag")
CHUNK_EDGES = 1 << 22  # edges per chunk of an in-memory source: about 100 MB of a chunk's arrays in a worker

SCHEMES = {
    "planetoid": "planetoid:DIR  (a directory with ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index})",
    "ogb": "ogb:DIR  (an OGB node-property dataset directory with raw/edge.csv.gz and split/)",
    "npz": "npz:PATH  (an .npz file or a directory of .npy files with edge_index, x, y, masks, ...)",
    "parquet": "parquet:DIR_OR_URL  (edges/*.parquet with src, dst; optional nodes/*.parquet with id; any "
               "integer IDs)",
    "synthetic": "synthetic:nodes=N,avg_degree=D,features=F,classes=C,seed=S",
    "synthetic-mag": "synthetic-mag:papers=N,features=F,classes=C,seed=S  (an ogbn-mag-shaped heterogeneous graph)",
}


def describe_schemes() -> str:
    return "; ".join(SCHEMES.values())


def resolve_source(data: Any, *, to_undirected: bool | None = None, scratch_dir: str | None = None,
                   storage_options: dict[str, Any] | None = None) -> GraphSource:
    """Return the graph named by ``data``: a SOURCE string, a PyG ``Data``/``HeteroData``, or a GraphSource.

    Chunked readers (``parquet:``, ``synthetic:``) are read whole here (:func:`materialize`), for the
    in-process engine; ``storage_options`` reach fsspec for a ``parquet:`` URL.

    Examples
    --------
    >>> g = resolve_source("synthetic:nodes=100,avg_degree=4,features=8,classes=2")
    >>> g.nodes[None].num_nodes
    100
    """
    if isinstance(data, GraphSource):
        return add_reverse_edges(data) if to_undirected else data
    if isinstance(data, ChunkedSource):
        from graphstore.ingest.materialize import materialize

        return resolve_source(materialize(data), to_undirected=to_undirected)
    if not isinstance(data, (str, os.PathLike)):
        from graphstore.ingest.read_pyg import from_pyg

        return add_reverse_edges(from_pyg(data)) if to_undirected else from_pyg(data)
    scheme, rest = _split(data)
    if scheme == "parquet":
        from graphstore.ingest.materialize import materialize
        from graphstore.ingest.read_parquet import read_parquet

        source = materialize(read_parquet(rest, storage_options))
    elif scheme == "planetoid":
        from graphstore.ingest.read_planetoid import read_planetoid

        source = read_planetoid(rest)
    elif scheme == "ogb":
        from graphstore.ingest.read_ogb import read_ogb

        source = read_ogb(rest, to_undirected=to_undirected, scratch_dir=scratch_dir)
        to_undirected = None  # the OGB reader already applied it
    elif scheme == "npz":
        from graphstore.ingest.read_npz import read_npz

        source = read_npz(rest)
    elif scheme == "synthetic-mag":
        from graphstore.ingest.synthetic_mag import parse_synthetic_mag_spec, synthetic_mag_graph

        source = synthetic_mag_graph(parse_synthetic_mag_spec(rest))
    else:
        from graphstore.ingest.synthetic import parse_synthetic_spec
        from graphstore.ingest.synthetic_chunks import synthetic_graph

        source = synthetic_graph(parse_synthetic_spec(rest))
    return add_reverse_edges(source) if to_undirected else source


def resolve_chunked(data: Any, *, to_undirected: bool | None = None, scratch_dir: str | None = None,
                    storage_options: dict[str, Any] | None = None) -> ChunkedSource:
    """Return the graph named by ``data`` as a :class:`ChunkedSource`, for engines that read in chunks.

    ``parquet:`` and ``synthetic:`` are read chunk by chunk (by whichever process runs a chunk's task);
    every other SOURCE (planetoid, ogb, npz, synthetic-mag, PyG objects, a GraphSource) is read into
    this process by :func:`resolve_source` and cut into chunks of :data:`CHUNK_EDGES` edges (each
    chunk, sent to a worker, carries only its own rows). ``to_undirected`` appends the reverse of
    every edge whose two ends have the same node type, as chunks of their own.

    Examples
    --------
    >>> c = resolve_chunked("synthetic:nodes=100,avg_degree=4,features=8,classes=2")
    >>> c.num_nodes, len(c.edge_chunks)
    ({None: 100}, 1)
    >>> len(resolve_chunked("synthetic:nodes=100,avg_degree=4", to_undirected=True).edge_chunks)
    2
    """
    if isinstance(data, ChunkedSource):
        chunked = data
    elif reads_in_chunks(data):
        scheme, rest = _split(data)
        if scheme == "parquet":
            from graphstore.ingest.read_parquet import read_parquet

            chunked = read_parquet(rest, storage_options)
        else:
            from graphstore.ingest.synthetic import parse_synthetic_spec
            from graphstore.ingest.synthetic_chunks import synthetic_chunked

            chunked = synthetic_chunked(parse_synthetic_spec(rest))
    else:
        scheme = _split(data)[0] if isinstance(data, (str, os.PathLike)) else type(data).__name__
        logger.warning("SOURCE %s cannot be read in chunks: it is read into this process whole, then cut into "
                       "chunks of %d edges", scheme, CHUNK_EDGES)
        return as_chunked(resolve_source(data, to_undirected=to_undirected, scratch_dir=scratch_dir,
                                         storage_options=storage_options))
    return with_reverse_edges(chunked) if to_undirected else chunked


def reads_in_chunks(data: Any) -> bool:
    """Whether ``data`` is read chunk by chunk (a ChunkedSource, ``parquet:`` or ``synthetic:``), not whole."""
    if isinstance(data, ChunkedSource):
        return True
    return isinstance(data, (str, os.PathLike)) and _split(data)[0] in ("parquet", "synthetic")


def as_chunked(source: GraphSource) -> ChunkedSource:
    """An in-memory graph cut into chunks of :data:`CHUNK_EDGES` edges; its cleanups move along."""
    from graphstore.ingest.chunked_graph import chunked_from_graph

    chunked = chunked_from_graph(source, CHUNK_EDGES)
    chunked.cleanups, source.cleanups = list(source.cleanups), []
    return chunked


def _split(data: str | os.PathLike[str]) -> tuple[str, str]:
    """``(scheme, rest)`` of a SOURCE string, the scheme known and a local path existing."""
    spec = os.fspath(data)
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in SCHEMES:
        raise UnknownSourceError(
            f"unknown SOURCE {spec!r}: it must start with one of {sorted(SCHEMES)}: {describe_schemes()}"
        )
    if scheme in _GENERATED or (scheme == "parquet" and "://" in rest):
        return scheme, rest
    if not os.path.exists(os.path.expanduser(rest)):
        raise SourceNotFoundError(f"SOURCE {spec!r}: {rest!r} does not exist; expected {SCHEMES[scheme]}")
    return scheme, os.path.expanduser(rest)


def add_reverse_edges(source: GraphSource) -> GraphSource:
    """A copy of ``source`` with the reverse of every edge appended, for each edge type whose two ends
    have the same node type (the caller's source is left as it was)."""
    import copy

    import numpy as np

    from graphstore.ingest.source import ArrayRows, EdgeTable

    edges = {}
    for etype, table in source.edges.items():
        if etype is not None and etype[0] != etype[2]:
            edges[etype] = table
            continue
        both = np.concatenate([np.arange(table.num_edges), np.arange(table.num_edges)])
        attrs = {k: ArrayRows(v.take(both)) for k, v in table.attrs.items()}
        edges[etype] = EdgeTable(np.concatenate([table.src, table.dst]), np.concatenate([table.dst, table.src]), attrs)
    source = copy.copy(source)
    source.edges = edges
    return source


@dataclass
class ReversedChunk:
    """The reverses of one edge chunk's edges: edge IDs ``offset + i`` for edge ``i`` of the original."""

    inner: Any
    offset: int

    @property
    def etype(self) -> Any:
        return self.inner.etype

    @property
    def start(self) -> int:
        return self.inner.start + self.offset

    @property
    def stop(self) -> int:
        return self.inner.stop + self.offset

    def read(self) -> Any:
        block = self.inner.read()
        return EdgeBlock(block.dst, block.src, block.attrs, block.start + self.offset)


def with_reverse_edges(chunked: ChunkedSource) -> ChunkedSource:
    """``chunked`` with the reverse of every edge appended (after all edges of its type, like
    :func:`add_reverse_edges`) for each edge type whose two ends have the same node type."""
    import copy

    out = copy.copy(chunked)
    out.num_edges = dict(chunked.num_edges)
    out.edge_chunks = list(chunked.edge_chunks)
    for etype, count in chunked.num_edges.items():
        if etype is None or etype[0] == etype[2]:
            out.edge_chunks += [ReversedChunk(c, count) for c in chunked.edge_chunks if c.etype == etype]
            out.num_edges[etype] = 2 * count
    return out
