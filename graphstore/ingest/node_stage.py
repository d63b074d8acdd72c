"""The node stages of an ingest: route node rows to their partition, then write each partition's rows.

``node-route`` reads one node chunk (a range of input IDs) and writes its rows, per partition, to
one file named by the chunk; the rows a partition replicates for its halo go to files named by
(partition, owner, chunk). Inside a partition nodes keep their input order, so a partition's files
read in chunk order are its rows in global-ID order: ``nodes`` appends them to the arrays one file
at a time. No task holds more than one chunk of rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import InvalidInputError
from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, NodeChunk
from graphstore.ingest.edge_stage import WriteSpec
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.scratch import Scratch, StoredArray
from graphstore.ingest.validate import SPLIT_MASKS, check_labels
from graphstore.ingest.chunk_writer import ArrayWriter
from graphstore.dataset.manifest import ArrayInfo
from graphstore.dataset.types import NodeType


@dataclass(frozen=True)
class NodePlan:
    """Per node type: its layout key, attribute schemas and the attributes its halos replicate."""

    keys: dict[NodeType, str]
    schema: dict[NodeType, dict[str, ColumnSchema]]
    replicate: dict[NodeType, tuple[str, ...]]

    def where(self, ntype: NodeType) -> str:
        return "the nodes" if ntype is None else f"node type {ntype!r}"


def read_node_chunk(chunk: NodeChunk, plan: NodePlan, columns: Any = None) -> dict[str, np.ndarray]:
    """Read one node chunk and check it: every attribute present, one row per node, in its schema's dtype,
    no negative label ``y`` on a node of a split mask (when ``y`` and the masks are read)."""
    rows = chunk.read(columns)
    count, where = chunk.stop - chunk.start, plan.where(chunk.ntype)
    out = {}
    for name, schema in plan.schema[chunk.ntype].items():
        if columns is not None and name not in columns:
            continue
        values = rows.get(name)
        if values is None:
            raise InvalidInputError(f"{where}: nodes {chunk.start}..{chunk.stop - 1} have no attribute {name!r}; "
                                    "every chunk of a node type must have all its attributes")
        values = np.asarray(values)
        if values.shape != (count, *schema.shape):
            raise InvalidInputError(f"{where}, attribute {name!r}: nodes {chunk.start}..{chunk.stop - 1} came with "
                                    f"shape {list(values.shape)}, expected {[count, *schema.shape]}")
        out[name] = values.astype(schema.dtype, copy=False)
    if "y" in out:
        check_labels(where, out["y"], {n: out[n] for n in SPLIT_MASKS if n in out}, chunk.start)
    return out


def part_halo(pieces: list[StoredArray]) -> np.ndarray:
    """The sorted global IDs of one part's halo of one node type: the union of what each edge type whose
    sources have that type found (files the ``edges`` stage wrote)."""
    if len(pieces) <= 1:
        return pieces[0].mapped() if pieces else np.zeros(0, np.int64)
    return np.unique(np.concatenate([piece.mapped() for piece in pieces]))


def route_nodes(item: tuple[int, NodeChunk], *, scratch: Scratch, books: dict[NodeType, Relabel], plan: NodePlan,
                halos: dict[NodeType, list[list[StoredArray]]]) -> int:
    """Stage ``node-route``: write one chunk's rows to the file of each partition owning some of them,
    and the rows each partition's halo replicates to (partition, owner) files. Returns the rows read."""
    index, chunk = item
    book, key = books[chunk.ntype], plan.keys[chunk.ntype]
    rows = read_node_chunk(chunk, plan)
    part = book.owner(book.new_of_orig[chunk.start: chunk.stop])
    for p in np.unique(part):
        sel = np.flatnonzero(part == p)
        scratch.put(f"nodes/{key}/{p:05d}/{index:06d}", {n: v[sel] for n, v in rows.items()})
    replicate = plan.replicate.get(chunk.ntype, ())
    for p, pieces in enumerate(halos.get(chunk.ntype, [])) if replicate else ():
        ids = part_halo(pieces)
        orig = book.order[ids]
        inside = np.flatnonzero((orig >= chunk.start) & (orig < chunk.stop))
        owner = book.owner(ids[inside])
        for q in np.unique(owner):
            sel = inside[owner == q]
            scratch.put(f"halo/{key}/{p:05d}/{q:05d}/{index:06d}",
                        {n: rows[n][orig[sel] - chunk.start] for n in replicate})
    return chunk.stop - chunk.start


@dataclass
class PartNodes:
    """What writing one partition's node arrays wrote: manifest entries, true values of each mask."""

    arrays: dict[str, ArrayInfo]
    masks: dict[str, int] = field(default_factory=dict)
    bytes_written: int = 0
    read_back: int = 0


def _finite(where: str, name: str, ids: np.ndarray, allow_nan: bool) -> Any:
    """A stream check refusing NaN/inf in a float attribute, naming the input ID of the row."""
    def check(block: np.ndarray, start: int) -> None:
        if block.dtype.kind == "f" and not allow_nan and not np.isfinite(block).all():
            bad = int(np.flatnonzero(~np.isfinite(block.reshape(len(block), -1)).all(axis=1))[0])
            raise InvalidInputError(
                f"{where}, attribute {name!r}: row of input ID {int(ids[start + bad])} holds NaN or inf; clean the "
                "data, or pass --allow-nan (allow_nan=True) to store it as is")
    return check


def _stream_rows(writer: ArrayWriter, scratch: Scratch, prefix: str, path: Any, names: Any, ids: np.ndarray,
                 plan: NodePlan, ntype: NodeType, allow_nan: bool) -> tuple[dict[str, ArrayInfo], dict[str, int]]:
    """Append the files below ``prefix``, in name order, to one array per attribute (rows of input IDs ``ids``)."""
    where = plan.where(ntype)
    streams = {n: writer.stream(path(n), (len(ids), *plan.schema[ntype][n].shape), plan.schema[ntype][n].dtype,
                                _finite(where, n, ids, allow_nan)) for n in names}
    trues = {n: 0 for n in names if np.dtype(plan.schema[ntype][n].dtype) == np.bool_}
    for piece in scratch.pieces(prefix) if streams else ():
        for name, stream in streams.items():
            stream.append(piece[name])
            if name in trues:
                trues[name] += int(np.count_nonzero(piece[name]))
    return {path(n): s.close() for n, s in streams.items()}, trues


def write_part_nodes(job: tuple[NodeType, int, list[StoredArray]], *, scratch: Scratch,
                     books: dict[NodeType, Relabel], plan: NodePlan, spec: WriteSpec) -> PartNodes:
    """Stage ``nodes``: one partition's ``orig_id``, its rows of every attribute, its halo IDs and replicas."""
    ntype, part, pieces = job
    halo = part_halo(pieces)
    book, key, writer = books[ntype], plan.keys[ntype], spec.writer()
    ids = book.order[book.offsets[part]: book.offsets[part + 1]]
    arrays = {layout.node_array(part, key, layout.ORIG_ID):
              writer.write_array(layout.node_array(part, key, layout.ORIG_ID), ids.astype(np.int64))}
    found, masks = _stream_rows(writer, scratch, f"nodes/{key}/{part:05d}",
                                lambda n: layout.node_array(part, key, n), list(plan.schema[ntype]), ids, plan,
                                ntype, spec.allow_nan)
    arrays.update(found)
    arrays[layout.halo_array(part, key, layout.HALO_IDS)] = writer.write_array(
        layout.halo_array(part, key, layout.HALO_IDS), halo.astype(np.int64))
    replicas, _ = _stream_rows(writer, scratch, f"halo/{key}/{part:05d}", lambda n: layout.halo_array(part, key, n),
                               plan.replicate.get(ntype, ()), book.order[halo], plan, ntype, spec.allow_nan)
    arrays.update(replicas)
    return PartNodes(arrays, {n: c for n, c in masks.items() if n.endswith("_mask")}, writer.bytes_written,
                     writer.read_back)


def run_node_stages(engine: Engine, source: ChunkedSource, *, scratch: Scratch, books: dict[NodeType, Relabel],
                    plan: NodePlan, halos: dict[NodeType, list[list[StoredArray]]], spec: WriteSpec,
                    progress: Progress | None = None) -> dict[tuple[NodeType, int], PartNodes]:
    """Route every node chunk, then write every (node type, part). ``halos``: per node type and part, the
    halo files of the edge types whose sources have that type."""
    order = {t: i for i, t in enumerate(source.num_nodes)}
    chunks = sorted(source.node_chunks, key=lambda c: (order[c.ntype], c.start))
    _check_cover(source, chunks)
    items = list(enumerate(chunks))
    replicated = {t: h for t, h in halos.items() if plan.replicate.get(t)}
    engine.map("node-route", route_nodes, items, progress, [c.stop - c.start for c in chunks], scratch=scratch,
               books=books, plan=plan, halos=replicated)
    num_parts = len(next(iter(books.values())).offsets) - 1
    jobs = [(t, p, halos[t][p]) for t in source.num_nodes for p in range(num_parts)]
    done = engine.map("nodes", write_part_nodes, jobs, progress,
                      [int(books[t].offsets[p + 1] - books[t].offsets[p]) for t, p, _ in jobs], scratch=scratch,
                      books=books, plan=plan, spec=spec)
    scratch.remove("nodes")
    scratch.remove("halo")
    scratch.remove("halos")
    return {(t, p): result for (t, p, _), result in zip(jobs, done)}


def _check_cover(source: ChunkedSource, chunks: list[NodeChunk]) -> None:
    """Node chunks of each type must cover ``0..num_nodes-1`` once (a type without attributes may have none)."""
    for ntype, count in source.num_nodes.items():
        spans = [(c.start, c.stop) for c in chunks if c.ntype == ntype]
        if not spans and not source.node_schema.get(ntype):
            continue
        edges = [0, *[b for _, b in spans]]
        if [a for a, _ in spans] != edges[:-1] or edges[-1] != count:
            raise InvalidInputError(f"the node chunks of {'the nodes' if ntype is None else repr(ntype)} cover "
                                    f"{spans}, not 0..{count - 1} once; a ChunkedSource must cut each node type "
                                    "into consecutive ranges")
