"""The edge stages of an ingest: route chunks to parts, then write each part's CSC, on any engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from graphstore import layout
from graphstore.ingest.chunks import EdgeChunk
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.route import PartCSC, RouteDir, part_csc, route_chunk
from graphstore.ingest.writer import ArrayWriter
from graphstore.manifest import ArrayInfo
from graphstore.storage import Location
from graphstore.types import EdgeType, NodeType

logger = logging.getLogger(__name__)
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class WriteSpec:
    """Where and how a worker writes arrays: the dataset location, codec, chunk size and NaN rule."""

    location: Location
    compression: str
    chunk_bytes: int
    allow_nan: bool


@dataclass
class PartEdges:
    """What writing one part of one edge type wrote and found (returned to the client, no edges in it)."""

    part: int
    arrays: dict[str, ArrayInfo]
    count: int
    cut: int
    self_loops: int
    duplicates: int
    halo: np.ndarray  # sorted global IDs of the remote sources of this part's edges
    bytes_written: int = 0
    read_back: int = 0


@dataclass
class EdgeTypeResult:
    """Per-part results of one edge type, in part order."""

    parts: list[PartEdges] = field(default_factory=list)


class _ByEdgeID:
    """Rows of a part's edge attribute, looked up by input edge ID (so errors name the input edge)."""

    def __init__(self, values: np.ndarray, eid: np.ndarray) -> None:
        self.values, self.order = values, np.argsort(eid, kind="stable")
        self.sorted_eid = eid[self.order]
        self.shape, self.dtype = values.shape, values.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self.values[self.order[np.searchsorted(self.sorted_eid, rows)]]


def write_part_edges(job: tuple[EdgeType, int], *, where: RouteDir, books: dict[NodeType, Relabel],
                     ekeys: dict[EdgeType, str], spec: WriteSpec, num_edges: dict[EdgeType, int]) -> PartEdges:
    """Sort one part's routed edges and write its CSC arrays and edge attributes straight to the dataset."""
    from graphstore.ingest.parts_writer import write_rows  # the one NaN-checking row writer

    etype, part = job
    s_type = None if etype is None else etype[0]
    d_type = None if etype is None else etype[2]
    csc = part_csc(job, where=where, books=books, ekeys=ekeys)
    writer = ArrayWriter(spec.location, spec.compression, spec.chunk_bytes, create_root=False)
    key, arrays = ekeys[etype], {}
    path = lambda name: layout.edge_array(part, key, name)  # noqa: E731
    arrays[path(layout.INDPTR)] = writer.write_array(path(layout.INDPTR), csc.indptr)
    arrays[path(layout.INDICES)] = writer.write_array(path(layout.INDICES), csc.indices.astype(np.int64))
    arrays[path(layout.EID)] = writer.write_array(path(layout.EID), csc.eid)
    if books[s_type].num_nodes <= _INT32_MAX and num_edges[etype] <= _INT32_MAX:
        arrays[path(layout.PACKED)] = writer.write_array(
            path(layout.PACKED), np.stack([csc.indices, csc.eid], axis=1).astype(np.int32))
    for name, values in csc.attrs.items():
        arrays[path(name)], _ = write_rows(writer, path(name), _ByEdgeID(values, csc.eid), csc.eid,
                                           f"{etype!r} edges", spec.allow_nan)
    return _part_result(part, csc, books, s_type, d_type, arrays, writer)


def _part_result(part: int, csc: PartCSC, books: dict[NodeType, Relabel], s_type: NodeType, d_type: NodeType,
                 arrays: dict[str, ArrayInfo], writer: ArrayWriter) -> PartEdges:
    s_lo, s_hi = books[s_type].offsets[part: part + 2]
    remote = csc.indices[(csc.indices < s_lo) | (csc.indices >= s_hi)]
    dst_lo = int(books[d_type].offsets[part])
    dst = np.repeat(np.arange(len(csc.indptr) - 1, dtype=np.int64) + dst_lo, np.diff(csc.indptr))
    same = (dst[1:] == dst[:-1]) & (csc.indices[1:] == csc.indices[:-1])
    loops = int(np.count_nonzero(csc.indices == dst)) if s_type == d_type else 0
    return PartEdges(part, arrays, len(csc.eid), len(remote), loops, int(np.count_nonzero(same)),
                     np.unique(remote), writer.bytes_written, writer.read_back)


def run_edge_stages(engine: Engine, chunks: list[EdgeChunk], *, where: RouteDir, assign: dict[NodeType, np.ndarray],
                    books: dict[NodeType, Relabel], ekeys: dict[EdgeType, str], spec: WriteSpec,
                    num_edges: dict[EdgeType, int], progress: Progress | None = None) -> dict[EdgeType, EdgeTypeResult]:
    """Route every edge chunk, then write every (edge type, part): the two edge stages of an ingest."""
    num_parts = len(next(iter(books.values())).offsets) - 1
    routed = engine.map("route", route_chunk, chunks, progress, [c.stop - c.start for c in chunks], where=where,
                        assign=assign, ekeys=ekeys, num_parts=num_parts)
    per_part = {(etype, part): 0 for etype in ekeys for part in range(num_parts)}
    for chunk, counts in zip(chunks, routed):
        for part, count in enumerate(counts):
            per_part[chunk.etype, part] += count
    jobs = list(per_part)
    done = engine.map("edges", write_part_edges, jobs, progress, list(per_part.values()), where=where, books=books,
                      ekeys=ekeys, spec=spec, num_edges=num_edges)
    out: dict[EdgeType, EdgeTypeResult] = {etype: EdgeTypeResult() for etype in ekeys}
    for (etype, _), result in zip(jobs, done):
        out[etype].parts.append(result)
    return out
