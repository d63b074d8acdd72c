"""Route edge chunks to the partition owning each destination, through files under a temporary prefix.

Stage functions here are pure: ``route_chunk`` writes one whole file per (chunk, part), named by
the chunk's first edge, so a retried task rewrites the same bytes; ``part_csc`` reads one part's
files in chunk order and sorts only that part's edges. No process holds all edges at once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from graphstore.ingest.chunks import EdgeChunk
from graphstore.ingest.relabel import Relabel
from graphstore.storage import LocalLocation, Location, LocationWrapper
from graphstore.types import EdgeType, NodeType

logger = logging.getLogger(__name__)
_ATTR = "a."


@dataclass(frozen=True)
class RouteDir:
    """Where routed edges live: the folder ``name`` inside the dataset being written at ``location``."""

    location: Location
    name: str

    def fs(self) -> tuple[Any, str]:
        """The file system of the dataset's location (its own credentials and endpoint) and the folder."""
        inner = self.location
        while isinstance(inner, LocationWrapper):
            inner = inner.inner
        if isinstance(inner, LocalLocation):
            return fsspec.filesystem("file"), f"{inner.root}/{self.name}"
        return inner.fs, f"{inner.root.rstrip('/')}/{self.name}"  # a RemoteLocation

    def part_dir(self, ekey: str, part: int) -> str:
        return f"{self.fs()[1]}/{ekey}/part-{part:05d}"


@contextlib.contextmanager
def route_dir(location: Location) -> Iterator[RouteDir]:
    """A fresh temporary folder ``.routing-<token>`` in the dataset at ``location``, removed at the end."""
    where = RouteDir(location, f".routing-{uuid.uuid4().hex[:12]}")
    try:
        yield where
    finally:
        fs, root = where.fs()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root, recursive=True)
        logger.debug("removed the routed edges at %s/%s", location.url, where.name)


def _endpoint_types(etype: EdgeType) -> tuple[NodeType, NodeType]:
    return (None, None) if etype is None else (etype[0], etype[2])


def route_chunk(chunk: EdgeChunk, *, where: RouteDir, assign: dict[NodeType, np.ndarray],
                ekeys: dict[EdgeType, str], num_parts: int) -> list[int]:
    """Read one edge chunk and write its edges, grouped by the partition owning the destination.

    Each file holds input-ID ``src``/``dst``, the global edge number ``eid`` and every edge attribute.
    Returns the number of edges routed to each part.
    """
    block = chunk.read()
    owner = assign[_endpoint_types(chunk.etype)[1]][block.dst]
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(num_parts + 1))
    fs, _ = where.fs()
    counts = []
    for part in range(num_parts):
        sel = order[bounds[part]: bounds[part + 1]]
        counts.append(len(sel))
        if not len(sel):
            continue
        arrays = {"src": np.asarray(block.src)[sel], "dst": np.asarray(block.dst)[sel],
                  "eid": (block.start + sel).astype(np.int64)}
        arrays.update({_ATTR + n: np.asarray(v)[sel] for n, v in block.attrs.items()})
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        directory = where.part_dir(ekeys[chunk.etype], part)
        fs.makedirs(directory, exist_ok=True)
        with fs.open(f"{directory}/{block.start:015d}.npz", "wb") as f:
            f.write(buffer.getvalue())
    return counts


def read_part(where: RouteDir, ekey: str, part: int) -> dict[str, np.ndarray]:
    """All edges routed to ``part`` for edge type ``ekey``, in global edge order (chunk files by name)."""
    fs, _ = where.fs()
    directory = where.part_dir(ekey, part)
    fs.invalidate_cache()  # other workers wrote these files
    names = sorted(fs.ls(directory, detail=False)) if fs.exists(directory) else []
    pieces: dict[str, list[np.ndarray]] = {}
    for name in names:
        with fs.open(name, "rb") as f, np.load(io.BytesIO(f.read())) as npz:
            for key in npz.files:
                pieces.setdefault(key, []).append(npz[key])
    if not pieces:
        return {"src": np.zeros(0, np.int64), "dst": np.zeros(0, np.int64), "eid": np.zeros(0, np.int64)}
    return {k: np.concatenate(v) for k, v in pieces.items()}


@dataclass(frozen=True)
class PartCSC:
    """One partition's CSC of one edge type: global-ID ``indptr``/``indices``, input edge IDs, attributes."""

    indptr: np.ndarray
    indices: np.ndarray
    eid: np.ndarray
    attrs: dict[str, np.ndarray]


def part_csc(job: tuple[EdgeType, int], *, where: RouteDir, books: dict[NodeType, Relabel],
             ekeys: dict[EdgeType, str]) -> PartCSC:
    """Sort one part's routed edges by (destination, source, edge ID): the slice the local writer makes."""
    etype, part = job
    s_type, d_type = _endpoint_types(etype)
    src_book, dst_book = books[s_type], books[d_type]
    edges = read_part(where, ekeys[etype], part)
    lo, hi = (int(x) for x in dst_book.offsets[part: part + 2])
    new_dst = dst_book.new_of_orig[edges["dst"]]
    new_src = src_book.new_of_orig[edges["src"]]
    perm = np.lexsort((edges["eid"], new_src, new_dst))
    indptr = np.zeros(hi - lo + 1, np.int64)
    np.cumsum(np.bincount(new_dst - lo, minlength=hi - lo), out=indptr[1:])
    attrs = {k[len(_ATTR):]: v[perm] for k, v in edges.items() if k.startswith(_ATTR)}
    return PartCSC(indptr, new_src[perm], edges["eid"][perm], attrs)
