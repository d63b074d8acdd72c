"""The edge stages of an ingest: route chunks to (part, block) files, then write each part's CSC, on any engine.

``route`` reads one edge chunk, relabels its endpoints and writes its edges to the partition owning
each destination, into a block of consecutive destinations (one file per chunk, part and block,
named by the chunk, so a retried task rewrites the same bytes). ``edges`` writes one partition's
CSC block after block: each block is sorted by (destination, source, edge ID) and appended to the
partition's arrays, so a task holds one block, whatever the partition's size.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import InvalidInputError
from graphstore.heap import release_freed
from graphstore.ingest.chunks import ChunkedSource, EdgeBlock, EdgeChunk
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.scratch import Scratch, StoredArray
from graphstore.ingest.validate import read_edge_block
from graphstore.ingest.chunk_writer import ArrayWriter, StreamArray
from graphstore.dataset.manifest import ArrayInfo
from graphstore.storage.local import Location
from graphstore.dataset.types import EdgeType, NodeType

logger = logging.getLogger(__name__)
_INT32_MAX = 2**31 - 1
_ATTR = "a."


@dataclass(frozen=True)
class WriteSpec:
    """Where and how a worker writes arrays: the dataset location, codec, chunk size and NaN rule."""

    location: Location
    compression: str
    chunk_bytes: int
    allow_nan: bool

    def writer(self) -> ArrayWriter:
        return ArrayWriter(self.location, self.compression, self.chunk_bytes, create_root=False)


@dataclass(frozen=True)
class EdgePlan:
    """Per edge type: its layout key, attribute schemas, edge count and destination blocks per part."""

    keys: dict[EdgeType, str]
    schema: dict[EdgeType, dict[str, Any]]  # attribute -> ColumnSchema
    num_edges: dict[EdgeType, int]
    blocks: dict[EdgeType, int]  # blocks of consecutive destinations in every part

    @staticmethod
    def ends(etype: EdgeType) -> tuple[NodeType, NodeType]:
        return (None, None) if etype is None else (etype[0], etype[2])


def block_starts(size: int, blocks: int) -> np.ndarray:
    """Local destination where each of ``blocks`` blocks of a part of ``size`` nodes starts, and ``size``."""
    return -((-np.arange(blocks + 1, dtype=np.int64) * size) // blocks)


def _read_chunk(index: int, chunk: EdgeChunk, books: dict[NodeType, Relabel], plan: EdgePlan,
                saved: Scratch | None) -> EdgeBlock:
    """One edge chunk: its endpoints as the ``adjacency`` stage saved them (checked there already) when it
    did and the edge type has no attributes, else read from the source and checked."""
    found = saved.keys(f"ends/{index:06d}") if saved is not None and not plan.schema[chunk.etype] else []
    if found:
        ends = saved.load(found[0])
        return EdgeBlock(ends["src"], ends["dst"], {}, chunk.start)
    s_type, d_type = plan.ends(chunk.etype)
    return read_edge_block(chunk, books[s_type].num_nodes, books[d_type].num_nodes)


def route_chunk(item: tuple[int, EdgeChunk], *, scratch: Scratch, books: dict[NodeType, Relabel],
                plan: EdgePlan, saved: Scratch | None = None) -> list[int]:
    """Stage ``route``: check one edge chunk, relabel it and write its edges to their (part, block) files.

    Each file holds global-ID ``src``/``dst``, the input edge ID ``eid`` and every edge attribute.
    ``saved``: the folder where the ``adjacency`` stage left the chunks' endpoints (None: read the source).
    Returns the number of edges routed to each part.
    """
    index, chunk = item
    s_type, d_type = plan.ends(chunk.etype)
    block = _read_chunk(index, chunk, books, plan, saved)
    src = books[s_type].new_of_orig[np.asarray(block.src)]
    dst = books[d_type].new_of_orig[np.asarray(block.dst)]
    offsets, blocks = books[d_type].offsets, plan.blocks[chunk.etype]
    part = np.searchsorted(offsets, dst, side="right") - 1
    local, size = dst - offsets[part], np.maximum(offsets[part + 1] - offsets[part], 1)
    group = part * blocks + (local * blocks) // size
    order = np.argsort(group, kind="stable")
    cuts = np.searchsorted(group[order], np.arange((len(offsets) - 1) * blocks + 1))
    narrow = id_dtype(max(books[s_type].num_nodes, books[d_type].num_nodes))
    for g in range(len(cuts) - 1):
        sel = order[cuts[g]: cuts[g + 1]]
        if len(sel):
            arrays = {"src": src[sel].astype(narrow), "dst": dst[sel].astype(narrow),
                      "eid": (block.start + sel).astype(np.int64),
                      **{_ATTR + n: np.asarray(v)[sel] for n, v in block.attrs.items()}}
            scratch.put(f"edges/{plan.keys[chunk.etype]}/{g // blocks:05d}/{g % blocks:05d}/{index:06d}", arrays)
    return np.bincount(part, minlength=len(offsets) - 1).tolist()


@dataclass
class PartEdges:
    """What writing one part of one edge type wrote and found (returned to the client, no edges in it)."""

    part: int
    arrays: dict[str, ArrayInfo]
    count: int
    cut: int
    self_loops: int
    duplicates: int
    halo: StoredArray  # sorted global IDs of the remote sources of this part's edges (a scratch file)
    touched_src: np.ndarray  # packed bits over the source type's global IDs: a source of some edge here
    touched_dst: np.ndarray  # packed bits over this part's own destinations: has an incoming edge
    split_counts: np.ndarray | None = None  # link_split values 0/1/2 counted, when the type has them
    bytes_written: int = 0
    read_back: int = 0


@dataclass
class _Sink:
    """The arrays of one part being appended to, and what has been found so far."""

    streams: dict[str, StreamArray]
    found: dict[str, Any] = field(default_factory=lambda: {"cut": 0, "loops": 0, "dups": 0})
    edges: int = 0


def _open(writer: ArrayWriter, etype: EdgeType, part: int, count: int, nodes: int, plan: EdgePlan,
          books: dict[NodeType, Relabel], check: Any) -> _Sink:
    s_type = plan.ends(etype)[0]
    path = lambda name: layout.edge_array(part, plan.keys[etype], name)  # noqa: E731
    streams = {layout.INDPTR: writer.stream(path(layout.INDPTR), (nodes + 1,), np.int64),
               layout.INDICES: writer.stream(path(layout.INDICES), (count,), np.int64),
               layout.EID: writer.stream(path(layout.EID), (count,), np.int64)}
    if books[s_type].num_nodes <= _INT32_MAX and plan.num_edges[etype] <= _INT32_MAX:
        streams[layout.PACKED] = writer.stream(path(layout.PACKED), (count, 2), np.int32)
    for name, schema in plan.schema[etype].items():
        streams[name] = writer.stream(path(name), (count, *schema.shape), schema.dtype, check(name))
    streams[layout.INDPTR].append(np.zeros(1, np.int64))
    return _Sink(streams)


def write_part_edges(job: tuple[EdgeType, int, int], *, scratch: Scratch, books: dict[NodeType, Relabel],
                     plan: EdgePlan, spec: WriteSpec) -> PartEdges:
    """Stage ``edges``: write one part's CSC arrays and edge attributes straight to the dataset, block by block."""
    etype, part, count = job
    s_type, d_type = plan.ends(etype)
    lo, hi = (int(x) for x in books[d_type].offsets[part: part + 2])
    s_lo, s_hi = (int(x) for x in books[s_type].offsets[part: part + 2])
    writer, where = spec.writer(), f"{etype!r} edges"
    eids: list[np.ndarray] = [np.zeros(0, np.int64)]
    check = lambda name: _finite_check(where, name, eids, spec.allow_nan)  # noqa: E731
    sink = _open(writer, etype, part, count, hi - lo, plan, books, check)
    touched = np.zeros(books[s_type].num_nodes, bool)  # the sources seen
    has_dst = np.zeros(hi - lo, bool)
    splits = np.zeros(3, np.int64) if layout.LINK_SPLIT in plan.schema[etype] else None
    starts = block_starts(hi - lo, plan.blocks[etype])
    for b in range(plan.blocks[etype]):
        b_lo, b_hi = lo + int(starts[b]), lo + int(starts[b + 1])
        edges = scratch.concat(f"edges/{plan.keys[etype]}/{part:05d}/{b:05d}",
                               {"src": np.int64, "dst": np.int64, "eid": np.int64})
        src, eid, degree, perm = _sort_block(edges, b_lo, b_hi - b_lo, len(touched), sink, s_type == d_type)
        eids[0] = eid
        sink.streams[layout.INDPTR].append(np.cumsum(degree) + sink.edges)
        sink.streams[layout.INDICES].append(src)
        sink.streams[layout.EID].append(eid)
        if layout.PACKED in sink.streams:
            packed = np.empty((len(src), 2), np.int32)
            packed[:, 0], packed[:, 1] = src, eid
            sink.streams[layout.PACKED].append(packed)
            del packed
        for name in plan.schema[etype]:
            values = edges.get(_ATTR + name)
            if values is None:
                raise InvalidInputError(f"{where}: attribute {name!r} is missing from some edge chunk; every chunk "
                                        "must have every edge attribute")
            sink.streams[name].append(values[perm])
            if name == layout.LINK_SPLIT and splits is not None:
                splits += np.bincount(values.astype(np.int64), minlength=3)[:3]
        sink.found["cut"] += int(len(src) - np.count_nonzero((src >= s_lo) & (src < s_hi)))
        touched[src] = True
        has_dst[b_lo - lo: b_hi - lo] = degree > 0
        sink.edges += len(src)
        del edges, src, eid, perm, degree
        release_freed()  # blocks differ in size: freed heap would otherwise pile up block after block
    arrays = {layout.edge_array(part, plan.keys[etype], n): s.close() for n, s in sink.streams.items()}
    touched_src = np.packbits(touched)
    touched[s_lo:s_hi] = False  # the halo: every source seen outside the part's own range
    halo = scratch.put_array(f"halos/{plan.keys[etype]}/{part:05d}.npy", _flagged(touched))
    return PartEdges(part, arrays, sink.edges, sink.found["cut"], sink.found["loops"], sink.found["dups"], halo,
                     touched_src, np.packbits(has_dst), splits, writer.bytes_written, writer.read_back)


def _flagged(flags: np.ndarray, step: int = 1 << 22) -> np.ndarray:
    """``np.flatnonzero(flags)`` as int32 IDs where they fit, without an int64 array of them all."""
    dtype = id_dtype(len(flags))
    return np.concatenate([np.flatnonzero(flags[a: a + step]).astype(dtype) + dtype(a)
                           for a in range(0, len(flags), step)] or [np.zeros(0, dtype)])


def id_dtype(num_nodes: int) -> type:
    """The dtype of node IDs below ``num_nodes`` in intermediate files: int32 when they fit."""
    return np.int32 if num_nodes <= _INT32_MAX else np.int64


def _sort_block(edges: dict[str, np.ndarray], b_lo: int, nodes: int, num_src: int, sink: _Sink,
                same_type: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """One block's edges (destinations ``b_lo ..``, ``nodes`` of them) in CSC order: sorted by (destination,
    source, edge ID), as one 8-byte key and the edge IDs. Returns the sources and edge IDs (int64) in that
    order, each destination's in-degree, and the permutation when edge attributes need it (else None);
    counts the block's self-loops and duplicates into ``sink``. 32 bytes an edge at the peak."""
    if nodes * num_src >= 2**63:  # the key would overflow: sort by the three columns
        src, dst, eid = (edges.pop(k).astype(np.int64) for k in ("src", "dst", "eid"))
        perm = np.lexsort((eid, src, dst))
        key, local, eid = src[perm], dst[perm] - b_lo, eid[perm]
    else:
        key = edges.pop("dst").astype(np.int64)
        key -= b_lo
        key *= num_src
        key += edges.pop("src")
        eid = edges.pop("eid").astype(np.int64, copy=False)
        perm = np.lexsort((eid, key))
        key = key[perm]
        eid = eid[perm]
        local = key // num_src  # each edge's destination, from b_lo
        local *= num_src
        key -= local  # each edge's source
        local //= num_src
    sink.found["dups"] += int(np.count_nonzero((key[1:] == key[:-1]) & (local[1:] == local[:-1])))
    degree = np.bincount(local, minlength=nodes)
    if same_type:
        local += b_lo
        sink.found["loops"] += int(np.count_nonzero(key == local))
    return key, eid, degree, perm if any(k.startswith(_ATTR) for k in edges) else None


def _finite_check(where: str, name: str, eids: list[np.ndarray], allow_nan: bool) -> Any:
    """A stream check refusing NaN/inf in a float edge attribute, naming the input edge ID."""
    def check(block: np.ndarray, start: int) -> None:
        if block.dtype.kind == "f" and not allow_nan and not np.isfinite(block).all():
            bad = int(np.flatnonzero(~np.isfinite(block.reshape(len(block), -1)).all(axis=1))[0])
            raise InvalidInputError(
                f"{where}, attribute {name!r}: row of input ID {int(eids[0][bad])} holds NaN or inf; clean the "
                "data, or pass --allow-nan (allow_nan=True) to store it as is")
    return check


@dataclass
class EdgeTypeResult:
    """Per-part results of one edge type, in part order."""

    parts: list[PartEdges] = field(default_factory=list)


def run_edge_stages(engine: Engine, source: ChunkedSource, *, scratch: Scratch, books: dict[NodeType, Relabel],
                    keys: dict[Any, str], spec: WriteSpec, block_edges: int, progress: Progress | None = None,
                    saved: Scratch | None = None) -> dict[EdgeType, EdgeTypeResult]:
    """Route every edge chunk, then write every (edge type, part): the two edge stages of an ingest.

    Destinations are cut into blocks of about ``block_edges`` edges (the task budget), evenly per part.
    ``saved``: where partitioning left the chunks' endpoints (``route`` then reads no source chunk twice).
    """
    num_parts = len(next(iter(books.values())).offsets) - 1
    plan = EdgePlan({t: keys[t] for t in source.num_edges}, dict(source.edge_schema), dict(source.num_edges),
                    {t: max(1, math.ceil(1.5 * n / num_parts / block_edges)) for t, n in source.num_edges.items()})
    chunks = list(enumerate(source.edge_chunks))
    routed = engine.map("route", route_chunk, chunks, progress, [c.stop - c.start for _, c in chunks],
                        scratch=scratch, books=books, plan=plan, saved=saved)
    per_part = {(etype, part): 0 for etype in plan.keys for part in range(num_parts)}
    for (_, chunk), counts in zip(chunks, routed):
        for part, count in enumerate(counts):
            per_part[chunk.etype, part] += count
    jobs = [(etype, part, count) for (etype, part), count in per_part.items()]
    done = engine.map("edges", write_part_edges, jobs, progress, list(per_part.values()), scratch=scratch,
                      books=books, plan=plan, spec=spec)
    scratch.remove("edges")
    out: dict[EdgeType, EdgeTypeResult] = {etype: EdgeTypeResult() for etype in plan.keys}
    for (etype, _, _), result in zip(jobs, done):
        out[etype].parts.append(result)
    return out
