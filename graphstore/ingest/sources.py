"""Turn what a user names as SOURCE (a string or a PyG object) into a :class:`GraphSource`."""

from __future__ import annotations

import os
from typing import Any

from graphstore.errors import SourceNotFoundError, UnknownSourceError
from graphstore.ingest.source import GraphSource

SCHEMES = {
    "planetoid": "planetoid:DIR  (a directory with ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index})",
    "ogb": "ogb:DIR  (an OGB node-property dataset directory with raw/edge.csv.gz and split/)",
    "npz": "npz:PATH  (an .npz file or a directory of .npy files with edge_index, x, y, masks, ...)",
    "synthetic": "synthetic:nodes=N,avg_degree=D,features=F,classes=C,seed=S",
    "synthetic-mag": "synthetic-mag:papers=N,features=F,classes=C,seed=S  (an ogbn-mag-shaped heterogeneous graph)",
}


def describe_schemes() -> str:
    return "; ".join(SCHEMES.values())


def resolve_source(data: Any, *, to_undirected: bool | None = None, scratch_dir: str | None = None) -> GraphSource:
    """Return the graph named by ``data``: a SOURCE string, a PyG ``Data``/``HeteroData``, or a GraphSource.

    Examples
    --------
    >>> g = resolve_source("synthetic:nodes=100,avg_degree=4,features=8,classes=2")
    >>> g.nodes[None].num_nodes
    100
    """
    if isinstance(data, GraphSource):
        return add_reverse_edges(data) if to_undirected else data
    if not isinstance(data, (str, os.PathLike)):
        from graphstore.ingest.read_pyg import from_pyg

        return add_reverse_edges(from_pyg(data)) if to_undirected else from_pyg(data)
    spec = os.fspath(data)
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in SCHEMES:
        raise UnknownSourceError(
            f"unknown SOURCE {spec!r}: it must start with one of {sorted(SCHEMES)}: {describe_schemes()}"
        )
    if scheme not in ("synthetic", "synthetic-mag") and not os.path.exists(os.path.expanduser(rest)):
        raise SourceNotFoundError(f"SOURCE {spec!r}: {rest!r} does not exist; expected {SCHEMES[scheme]}")
    rest = os.path.expanduser(rest)
    if scheme == "planetoid":
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
        from graphstore.ingest.synthetic import parse_synthetic_spec, synthetic_graph

        source = synthetic_graph(parse_synthetic_spec(rest))
    return add_reverse_edges(source) if to_undirected else source


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
