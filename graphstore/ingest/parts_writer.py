"""Write every partition's arrays: CSC topology per edge type, owned node rows, halo IDs and replicas."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphstore import layout
from graphstore.errors import InvalidInputError
from graphstore.ingest.relabel import Relabel
from graphstore.ingest.source import EdgeTable, EdgeType, GraphSource, NodeType, RowSource
from graphstore.ingest.writer import ArrayWriter
from graphstore.manifest import ArrayInfo

Progress = Callable[[str, int, int], None]
_BLOCK = 1 << 22
_INT32_MAX = 2**31 - 1


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

    # -- edges --

    def write_edges(self, etype: EdgeType) -> EdgeStats:
        """Sort one edge type by (destination, source) and write each partition's CSC slice.

        Memory: about 32 bytes per edge of this type (sort key, permutation, sources, sort scratch).
        """
        table = self.source.edges[etype]
        s_type, d_type = (None, None) if etype is None else (etype[0], etype[2])
        src_book, dst_book = self.books[s_type], self.books[d_type]
        if src_book.num_nodes * max(dst_book.num_nodes, 1) >= 2**62:
            raise InvalidInputError(f"edge type {etype!r}: too many nodes to sort edges by a 64-bit key")
        key = dst_book.new_of_orig[table.dst]
        ptr = np.zeros(dst_book.num_nodes + 1, np.int64)
        np.cumsum(np.bincount(key, minlength=dst_book.num_nodes), out=ptr[1:])
        new_src = src_book.new_of_orig[table.src]
        stats = EdgeStats([], self_loops=int(np.count_nonzero(new_src == key)) if s_type == d_type else 0)
        key *= src_book.num_nodes
        key += new_src  # key = destination * num_src + source, sorted below
        perm = np.argsort(key, kind="stable")
        stats.duplicates = _count_duplicates(key, perm)
        del key
        indices = new_src[perm]
        del new_src
        for part in range(self.num_parts):
            self._write_edge_part(etype, table, part, ptr, perm, indices, stats)
        return stats

    def _write_edge_part(self, etype: EdgeType, table: EdgeTable, part: int, ptr: np.ndarray, perm: np.ndarray,
                         indices: np.ndarray, stats: EdgeStats) -> None:
        key = self.keys[etype]
        s_type = None if etype is None else etype[0]
        lo, hi = self.books[None if etype is None else etype[2]].offsets[part: part + 2]
        a, b = int(ptr[lo]), int(ptr[hi])
        self._put(layout.edge_array(part, key, layout.INDPTR), self.writer.write_array(
            layout.edge_array(part, key, layout.INDPTR), ptr[lo: hi + 1] - a))
        seg = indices[a:b]
        self._write(layout.edge_array(part, key, layout.INDICES), (b - a,), np.int64, lambda s, t: seg[s:t])
        self._write(layout.edge_array(part, key, layout.EID), (b - a,), np.int64, lambda s, t: perm[a + s: a + t])
        if self.books[s_type].num_nodes <= _INT32_MAX and table.num_edges <= _INT32_MAX:
            self._write(layout.edge_array(part, key, layout.PACKED), (b - a, 2), np.int32,
                        lambda s, t: np.stack([seg[s:t], perm[a + s: a + t]], axis=1).astype(np.int32))
        for name, rows in table.attrs.items():
            self._write_rows(layout.edge_array(part, key, name), rows, perm[a:b], f"{etype!r} edges")
        s_lo, s_hi = self.books[s_type].offsets[part: part + 2]
        remote = seg[(seg < s_lo) | (seg >= s_hi)]
        stats.per_part.append(b - a)
        stats.cut += len(remote)
        self.halo.setdefault((part, s_type), []).append(np.unique(remote))
        if self.progress:
            self.progress("edges", b - a, table.num_edges)

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
        total = [0]
        dtype = np.dtype(source.dtype)

        def check(block: np.ndarray, start: int) -> None:
            if dtype.kind == "f" and not self.allow_nan and not np.isfinite(block).all():
                bad = int(np.flatnonzero(~np.isfinite(block.reshape(len(block), -1)).all(axis=1))[0])
                raise InvalidInputError(
                    f"{where}, attribute {path.rsplit('/', 1)[-1]!r}: row of input ID {int(rows[start + bad])} "
                    "holds NaN or inf; clean the data, or pass --allow-nan (allow_nan=True) to store it as is"
                )
            if dtype == np.bool_:
                total[0] += int(np.count_nonzero(block))

        self._write(path, (len(rows), *source.shape[1:]), dtype, lambda s, t: source.take(rows[s:t]), check)
        return total[0]


def _count_duplicates(key: np.ndarray, perm: np.ndarray) -> int:
    """Edges whose (destination, source) key equals their predecessor's in sorted order (blockwise)."""
    count = 0
    for start in range(1, len(perm), _BLOCK):
        block = key[perm[start - 1: start + _BLOCK]]
        count += int(np.count_nonzero(block[1:] == block[:-1]))
    return count
