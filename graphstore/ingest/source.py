"""The in-memory description of a graph handed to ingest: node tables, edge tables, row sources."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from graphstore.dataset.types import EdgeType, NodeType

__all__ = ["EdgeType", "NodeType"]  # re-exported for readers

# dtypes torch can hold without conversion; anything else is refused at ingest
SUPPORTED_DTYPES = frozenset(
    np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
)


@runtime_checkable
class RowSource(Protocol):
    """Anything ingest can read rows from: a shape, a dtype and random row access.

    ``take(rows)`` must accept any int64 array of row numbers (unsorted, repeated) and return an
    ``np.ndarray`` of shape ``(len(rows), *shape[1:])``. Ingest asks for bounded batches only, so a
    source never has to hold all its rows in memory.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def take(self, rows: np.ndarray) -> np.ndarray: ...


class ArrayRows:
    """A :class:`RowSource` over an in-memory or memory-mapped array (numpy, torch, anything array-like)."""

    def __init__(self, array: Any) -> None:
        if hasattr(array, "detach"):  # torch.Tensor without importing torch here
            array = array.detach().cpu().numpy()
        self._array = array if isinstance(array, np.ndarray) else np.asarray(array)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) > 1 and np.all(rows[1:] == rows[:-1] + 1):  # a contiguous run: slice, no gather
            return np.asarray(self._array[rows[0] : rows[-1] + 1])
        return np.asarray(self._array[rows])


def as_rows(value: Any) -> RowSource:
    """Wrap ``value`` as a :class:`RowSource` unless it already is one."""
    if isinstance(value, RowSource) and not isinstance(value, np.ndarray):
        return value
    return ArrayRows(value)


@dataclass
class NodeTable:
    """The nodes of one type: how many, and named per-node attributes (``x``, ``y``, masks, ``time``)."""

    num_nodes: int
    attrs: dict[str, RowSource] = field(default_factory=dict)


@dataclass
class EdgeTable:
    """The edges of one type as input-ID pairs, and named per-edge attributes aligned with them."""

    src: np.ndarray
    dst: np.ndarray
    attrs: dict[str, RowSource] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return int(len(self.src))


@dataclass
class GraphSource:
    """A whole graph ready to ingest. Homogeneous graphs use the single key ``None`` for types.

    ``origin`` is the provenance string recorded in the manifest (never credentials);
    ``cleanups`` are called by :meth:`close` (temporary files a reader made).
    """

    nodes: dict[NodeType, NodeTable]
    edges: dict[EdgeType, EdgeTable]
    name: str = "graph"
    origin: str = "python"
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def is_hetero(self) -> bool:
        return None not in self.nodes

    def add_temp_dir(self, path: str) -> None:
        """Delete ``path`` (a scratch directory of a reader) when the source is closed."""
        self.cleanups.append(lambda: shutil.rmtree(path, ignore_errors=True))

    def close(self) -> None:
        while self.cleanups:
            with contextlib.suppress(Exception):
                self.cleanups.pop()()

    def __enter__(self) -> GraphSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
