"""Write every partition's node arrays: owned node rows, halo IDs and replicas (edges: ``edge_stage``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphstore import layout
from graphstore.errors import InvalidInputError
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.source import GraphSource, NodeType, RowSource
from graphstore.ingest.writer import ArrayWriter
from graphstore.manifest import ArrayInfo

Progress = Callable[[str, int, int], None]


@dataclass
class EdgeStats:
    """What writing one edge type found: per-partition counts, cut edges, self-loops, duplicates."""

    per_part: list[int]
    cut: int = 0
    self_loops: int = 0
    duplicates: int = 0


@dataclass
class PartsWriter:
    """Writes the partitions of ``source`` relabelled by ``books`` through ``writer``."""

    source: GraphSource
    books: dict[NodeType, Relabel]
    keys: dict[object, str]  # node type / edge type -> layout key
    writer: ArrayWriter
    allow_nan: bool = False
    progress: Progress | None = None
    arrays: dict[str, ArrayInfo] = field(default_factory=dict)
    halo: dict[tuple[int, NodeType], list[np.ndarray]] = field(default_factory=dict)

    @property
    def num_parts(self) -> int:
        return len(next(iter(self.books.values())).offsets) - 1

    def _put(self, path: str, info: ArrayInfo) -> None:
        self.arrays[path] = info

    # -- nodes --

    def write_nodes(self, ntype: NodeType) -> dict[str, int]:
        """Write every partition's owned rows of each attribute, and ``orig_id``; return mask counts."""
        table, book, key = self.source.nodes[ntype], self.books[ntype], self.keys[ntype]
        counts: dict[str, int] = {}
        for part in range(self.num_parts):
            rows = book.order[book.offsets[part]: book.offsets[part + 1]]
            self._put(layout.node_array(part, key, layout.ORIG_ID),
                      self.writer.write(layout.node_array(part, key, layout.ORIG_ID), (len(rows),), np.int64,
                                        lambda s, t: rows[s:t]))
            for name, source in table.attrs.items():
                total = self._write_rows(layout.node_array(part, key, name), source, rows,
                                         "the nodes" if ntype is None else f"node type {ntype!r}")
                if name.endswith("_mask"):
                    counts[name] = counts.get(name, 0) + total
            if self.progress:
                self.progress("nodes", len(rows), table.num_nodes)
        return counts

    def write_halo(self, ntype: NodeType, replicate: tuple[str, ...]) -> None:
        """Write each partition's sorted halo IDs of ``ntype`` and the replicated attributes."""
        table, book, key = self.source.nodes[ntype], self.books[ntype], self.keys[ntype]
        for part in range(self.num_parts):
            found = self.halo.get((part, ntype), [])
            ids = np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
            self._put(layout.halo_array(part, key, layout.HALO_IDS),
                      self.writer.write_array(layout.halo_array(part, key, layout.HALO_IDS), ids.astype(np.int64)))
            for name in replicate:
                self._write_rows(layout.halo_array(part, key, name), table.attrs[name], book.order[ids],
                                 f"halo of {ntype!r}")

    # -- helpers --

    def _write(self, path: str, shape: tuple[int, ...], dtype: object, fill: Callable, check: Callable | None = None
               ) -> None:
        self._put(path, self.writer.write(path, shape, dtype, fill, check))

    def _write_rows(self, path: str, source: RowSource, rows: np.ndarray, where: str) -> int:
        """Write ``source`` rows ``rows`` (input IDs) to ``path``; return the count of true values."""
        self.arrays[path], total = write_rows(self.writer, path, source, rows, where, self.allow_nan)
        return total


def write_rows(writer: ArrayWriter, path: str, source: RowSource, rows: np.ndarray, where: str,
               allow_nan: bool) -> tuple[ArrayInfo, int]:
    """Write ``source`` rows ``rows`` (input IDs) to ``path``; return its info and the count of true values.

    NaN or inf in a float attribute is refused (naming the input ID) unless ``allow_nan``.
    """
    total = [0]
    dtype = np.dtype(source.dtype)

    def check(block: np.ndarray, start: int) -> None:
        if dtype.kind == "f" and not allow_nan and not np.isfinite(block).all():
            bad = int(np.flatnonzero(~np.isfinite(block.reshape(len(block), -1)).all(axis=1))[0])
            raise InvalidInputError(
                f"{where}, attribute {path.rsplit('/', 1)[-1]!r}: row of input ID {int(rows[start + bad])} "
                "holds NaN or inf; clean the data, or pass --allow-nan (allow_nan=True) to store it as is"
            )
        if dtype == np.bool_:
            total[0] += int(np.count_nonzero(block))

    info = writer.write(path, (len(rows), *source.shape[1:]), dtype, lambda s, t: source.take(rows[s:t]), check)
    return info, total[0]
