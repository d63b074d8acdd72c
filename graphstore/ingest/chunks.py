"""Bounded, picklable pieces of a graph source: the unit of work every ingest engine schedules.

A :class:`ChunkedSource` describes a graph without holding it: node counts, attribute schemas,
edge counts, and lists of :class:`EdgeChunk` / :class:`NodeChunk` whose ``read()`` may run in any
process (a Dask worker, or the client itself for ``--engine local``). A chunk is a pure function of
its fields: reading it twice gives the same arrays, so a retried task changes nothing.

Readers that can read in pieces (``parquet:``, ``synthetic:``) produce a :class:`ChunkedSource`
directly; any in-memory :class:`~graphstore.ingest.source.GraphSource` can be wrapped as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from graphstore.dataset.types import EdgeType, NodeType

_PROCESS_CACHES: list[Callable[[], None]] = []


def process_cache(cached: Callable) -> Callable:
    """Register an ``functools.lru_cache``-wrapped function whose tables a source's chunks share within one
    process (a synthetic graph's community tables): the engines clear them after every stage, so a worker
    does not carry them into stages that never read the source's edges."""
    _PROCESS_CACHES.append(cached.cache_clear)
    return cached


def forget_process_caches() -> None:
    """Clear every cache registered by :func:`process_cache` (the next read rebuilds what it needs)."""
    for clear in _PROCESS_CACHES:
        clear()


@dataclass(frozen=True)
class ColumnSchema:
    """The dtype and per-row shape (``()`` for scalars) of one node or edge attribute."""

    dtype: str
    shape: tuple[int, ...] = ()


@dataclass
class EdgeBlock:
    """The edges of one chunk: endpoints as node IDs ``0..num_nodes-1`` of their types, and attributes.

    ``start`` is the global number of the chunk's first edge within its edge type: chunks of one type
    cover ``0..num_edges-1`` without gaps or overlap, so edge order (and any per-edge value derived from
    it) is the same whichever engine read the chunks.
    """

    src: np.ndarray
    dst: np.ndarray
    attrs: dict[str, np.ndarray]
    start: int


@runtime_checkable
class EdgeChunk(Protocol):
    """One bounded, picklable piece of one edge type's edges."""

    etype: EdgeType
    start: int  # global number of its first edge within the edge type
    stop: int  # one past its last edge

    def read(self) -> EdgeBlock: ...


@runtime_checkable
class NodeChunk(Protocol):
    """One bounded, picklable range ``[start, stop)`` of node IDs of one type, with all their attributes."""

    ntype: NodeType
    start: int
    stop: int

    def read(self, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Attribute name -> rows for IDs ``start..stop-1`` (only ``columns``, those the type has, when given)."""
        ...


@dataclass
class ChunkedSource:
    """A whole graph as bounded chunks. Homogeneous graphs use the single key ``None`` for types.

    ``origin`` is the provenance string recorded in the manifest (never credentials); ``cleanups``
    are called by :meth:`close`.
    """

    num_nodes: dict[NodeType, int]
    node_schema: dict[NodeType, dict[str, ColumnSchema]]
    num_edges: dict[EdgeType, int]
    edge_schema: dict[EdgeType, dict[str, ColumnSchema]]
    edge_chunks: list[EdgeChunk]
    node_chunks: list[NodeChunk]
    name: str = "graph"
    origin: str = "python"
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def is_hetero(self) -> bool:
        return None not in self.num_nodes

    def close(self) -> None:
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception:  # noqa: BLE001  (closing must not hide the error that led here)
                pass

    def __enter__(self) -> ChunkedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
