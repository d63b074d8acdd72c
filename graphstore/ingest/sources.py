"""Turn what a user names as SOURCE (a string or a PyG object) into a :class:`GraphSource`."""

from __future__ import annotations

import os
from typing import Any

from graphstore.errors import SourceNotFoundError, UnknownSourceError
from graphstore.ingest.chunks import ChunkedSource
from graphstore.ingest.source import GraphSource

_GENERATED = ("synthetic", "synthetic-mag")

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

    ``parquet:`` and ``synthetic:`` are read chunk by chunk; every other SOURCE (planetoid, ogb, npz,
    synthetic-mag, PyG objects, a GraphSource) is read whole by :func:`resolve_source` in this
    process and wrapped as one chunk per type (logged once, naming the scheme). ``to_undirected``
    on a chunked reader is refused rather than ignored.

    Examples
    --------
    >>> c = resolve_chunked("synthetic:nodes=100,avg_degree=4,features=8,classes=2")
    >>> c.num_nodes, len(c.edge_chunks)
    ({None: 100}, 1)
    """
    if isinstance(data, ChunkedSource):
        chunked = data
    elif isinstance(data, (str, os.PathLike)) and _split(data)[0] in ("parquet", "synthetic"):
        scheme, rest = _split(data)
        if scheme == "parquet":
            from graphstore.ingest.read_parquet import read_parquet

            chunked = read_parquet(rest, storage_options)
        else:
            from graphstore.ingest.synthetic import parse_synthetic_spec
            from graphstore.ingest.synthetic_chunks import synthetic_chunked

            chunked = synthetic_chunked(parse_synthetic_spec(rest))
    else:
        from graphstore.ingest.materialize import chunked_whole

        scheme = _split(data)[0] if isinstance(data, (str, os.PathLike)) else type(data).__name__
        return chunked_whole(resolve_source(data, to_undirected=to_undirected, scratch_dir=scratch_dir,
                                            storage_options=storage_options), scheme)
    if to_undirected:
        from graphstore.errors import InvalidInputError

        raise InvalidInputError(f"to_undirected is not supported when reading {chunked.origin!r} in chunks; store "
                                "both directions of every edge in the source, or use the local engine")
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
