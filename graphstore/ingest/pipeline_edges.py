"""The client side of the edge stages: cut the source into chunks, run the stages, gather the statistics."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphstore.ingest.chunked_graph import chunked_from_graph
from graphstore.ingest.edge_stage import EdgeTypeResult, WriteSpec, run_edge_stages
from graphstore.ingest.engine import Engine
from graphstore.ingest.parts_writer import EdgeStats, PartsWriter
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.route import route_dir
from graphstore.ingest.source import GraphSource
from graphstore.types import EdgeType, NodeType

CHUNK_EDGES = 1 << 22  # edges per routed chunk: about 100 MB of a chunk's arrays in a worker


def write_edges(source: GraphSource, spec: WriteSpec, assign: dict[NodeType, np.ndarray],
                books: dict[NodeType, Relabel], keys: dict[Any, str], parts: PartsWriter, *,
                engine: Engine) -> dict[EdgeType, EdgeStats]:
    """Route and write every edge type's partitions on ``engine``; record arrays and halos in ``parts``.

    The routed edges live under a temporary prefix of the dataset, removed at the end, also on failure.
    """
    chunked = chunked_from_graph(source, CHUNK_EDGES)
    num_edges = {etype: table.num_edges for etype, table in source.edges.items()}
    with route_dir(spec.location) as where:
        results = run_edge_stages(engine, chunked.edge_chunks, where=where, assign=assign, books=books,
                                  ekeys={etype: keys[etype] for etype in source.edges}, spec=spec,
                                  num_edges=num_edges, progress=parts.progress)
    return {etype: _gather(etype, result, parts) for etype, result in results.items()}


def _gather(etype: EdgeType, result: EdgeTypeResult, parts: PartsWriter) -> EdgeStats:
    s_type = None if etype is None else etype[0]
    stats = EdgeStats([])
    for part in result.parts:
        parts.arrays.update(part.arrays)
        parts.halo.setdefault((part.part, s_type), []).append(part.halo)
        parts.writer.bytes_written += part.bytes_written
        parts.writer.read_back += part.read_back
        stats.per_part.append(part.count)
        stats.cut += part.cut
        stats.self_loops += part.self_loops
        stats.duplicates += part.duplicates
    return stats
