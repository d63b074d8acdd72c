"""Read a graph from Parquet edge and node datasets (a directory or fsspec URL) as bounded chunks.

Layout (``PATH`` a local directory or an fsspec URL such as ``s3://bucket/graph``)::

    PATH/edges/*.parquet   src, dst (integers, required) and optional edge columns
    PATH/nodes/*.parquet   id (integer, required) and node columns (optional dataset)

Files are read in name order, each in its row groups. Node IDs may be any int64 values (unsorted,
gaps, negative): they are remapped to ``0..N-1`` in ascending order of the original ID, and the
original ID is stored as the node attribute ``id`` (so ``id[orig_id]`` of a dataset is the user's ID).
Without a nodes dataset the nodes are the union of the edge endpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.errors import InvalidInputError, MissingBackendError, SourceNotFoundError
from graphstore.ingest.chunks import ChunkedSource, ColumnSchema, EdgeBlock
from graphstore.ingest.parquet_columns import (is_list_column, attr_names, column_schema, list_width, schema_difference,
                                               to_numpy)
from graphstore.dataset.types import EdgeType, NodeType

logger = logging.getLogger(__name__)

ID_COLUMN = "id"
EDGE_KEYS = ("src", "dst")
LAYOUT = "PATH/edges/*.parquet with columns src, dst (+ edge columns); optional PATH/nodes/*.parquet with id"
NODE_CHUNK_MIN = 1 << 16  # node IDs per NodeChunk at least (more when node row groups are larger)
UNION_BATCH = 1 << 22  # endpoint values gathered before merging them into the sorted union


@dataclass(frozen=True)
class Piece:
    """One row group of one Parquet file."""

    path: str
    row_group: int
    rows: int

    def where(self) -> str:
        return f"{self.path} (row group {self.row_group})"

    def read(self, fs: Any, columns: list[str]) -> Any:
        """The row group's ``columns`` as a pyarrow Table; the file is opened and closed here."""
        import pyarrow.parquet as pq

        with fs.open(self.path, "rb") as fh:
            return pq.ParquetFile(fh).read_row_group(self.row_group, columns=columns)


@dataclass
class ParquetEdgeChunk:
    """The edges of one row group, endpoints remapped through ``ids`` (the sorted original node IDs)."""

    fs: Any
    piece: Piece
    ids: np.ndarray
    columns: dict[str, str]  # edge column -> attribute name
    schema: dict[str, ColumnSchema]
    start: int
    stop: int
    etype: EdgeType = None

    def read(self) -> EdgeBlock:
        table = self.piece.read(self.fs, [*EDGE_KEYS, *self.columns])
        where = self.piece.where()
        ends = [self._remap(to_numpy(table.column(k), k, ColumnSchema("<i8"), where), k) for k in EDGE_KEYS]
        attrs = {name: to_numpy(table.column(col), col, self.schema[name], where)
                 for col, name in self.columns.items()}
        return EdgeBlock(ends[0], ends[1], attrs, self.start)

    def _remap(self, values: np.ndarray, column: str) -> np.ndarray:
        pos = np.searchsorted(self.ids, values)
        if not len(self.ids):
            bad = np.ones(len(values), dtype=bool)
        else:
            bad = (pos >= len(self.ids)) | (self.ids[np.minimum(pos, len(self.ids) - 1)] != values)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InvalidInputError(
                f"{self.piece.where()}: {column} {int(values[row])} (row {row} of the row group) is not an id of "
                "the nodes dataset; add that node to the nodes files or drop the edge"
            )
        return pos.astype(np.int64)


@dataclass
class ParquetNodeChunk:
    """Node IDs ``[start, stop)`` (remapped): the original ``id`` and every node column of those nodes.

    ``pieces`` are the row groups holding any of these IDs: one per chunk when the nodes files are
    sorted by ID, possibly all of them when they are not (each row group is then read once per chunk).
    """

    fs: Any
    pieces: tuple[Piece, ...]
    ids: np.ndarray
    columns: dict[str, str]  # node column -> attribute name
    schema: dict[str, ColumnSchema]
    start: int
    stop: int
    ntype: NodeType = None

    def read(self, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        cols = {c: n for c, n in self.columns.items() if columns is None or n in columns}
        out = {name: np.empty((self.stop - self.start, *self.schema[name].shape), dtype=self.schema[name].dtype)
               for name in cols.values()}
        for piece in self.pieces if cols else ():
            table = piece.read(self.fs, [ID_COLUMN, *cols])
            where = piece.where()
            rank = np.searchsorted(self.ids, to_numpy(table.column(ID_COLUMN), ID_COLUMN, ColumnSchema("<i8"), where))
            keep = np.flatnonzero((rank >= self.start) & (rank < self.stop))
            for col, name in cols.items():
                out[name][rank[keep] - self.start] = to_numpy(table.column(col), col, self.schema[name], where)[keep]
        if columns is None or ID_COLUMN in columns:
            out = {ID_COLUMN: self.ids[self.start:self.stop].copy(), **out}
        return out


def read_parquet(url: str, storage_options: dict[str, Any] | None = None) -> ChunkedSource:
    """Plan the chunks of a Parquet graph: reads file footers and the node IDs, no other data.

    The plan reads every ``id`` column (or, without a nodes dataset, every ``src``/``dst``) once to
    build the sorted table of original IDs: 8 bytes per node, held by the caller and shipped inside
    every chunk (so a chunk pickles to ~8 B x nodes plus a few hundred bytes: scatter the chunks once
    on Dask rather than once per task when the graph has many nodes).

    Parameters
    ----------
    url : str
        A local directory or fsspec URL laid out as in the module docstring.
    storage_options : dict, optional
        Passed to fsspec (``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}``).

    Returns
    -------
    ChunkedSource
        Homogeneous; one edge chunk per edges row group, node chunks covering ID ranges.

    Raises
    ------
    SourceNotFoundError
        If ``url`` or its ``edges`` dataset is missing or holds no Parquet file.
    InvalidInputError
        On a missing ``src``/``dst``/``id`` column, a non-numeric, null or ragged column, duplicate
        node IDs, or a hetero (subdirectory) layout.

    Examples
    --------
    >>> import pandas as pd, os
    >>> os.makedirs("/tmp/pq/edges", exist_ok=True)
    >>> pd.DataFrame({"src": [10, -3], "dst": [-3, 7]}).to_parquet("/tmp/pq/edges/part0.parquet")
    >>> read_parquet("/tmp/pq").num_nodes
    {None: 3}
    """
    fs, root = _filesystem(url, storage_options or {})
    edge_pieces, edge_arrow = _dataset(fs, root, "edges", required=True)
    node_pieces, node_arrow = _dataset(fs, root, "nodes", required=False)
    edge_cols = _columns(fs, edge_pieces, edge_arrow, EDGE_KEYS, "edges")
    node_cols = _columns(fs, node_pieces, node_arrow, (ID_COLUMN,), "nodes") if node_pieces else ({}, {})
    ids, spans = _node_ids(fs, node_pieces) if node_pieces else (_endpoint_ids(fs, edge_pieces), [])
    node_schema = {ID_COLUMN: ColumnSchema("<i8"), **node_cols[1]}
    edges, start = [], 0
    for piece in edge_pieces:
        edges.append(ParquetEdgeChunk(fs, piece, ids, edge_cols[0], edge_cols[1], start, start + piece.rows))
        start += piece.rows
    nodes = _node_chunks(fs, list(zip(node_pieces, spans)), ids, node_cols)
    logger.info("parquet %s: %d nodes, %d edges in %d row groups, node attrs %s, edge attrs %s", url, len(ids),
                start, len(edge_pieces), sorted(node_schema), sorted(edge_cols[1]))
    name = root.rstrip("/").rsplit("/", 1)[-1] or "graph"
    return ChunkedSource({None: len(ids)}, {None: node_schema}, {None: start}, {None: edge_cols[1]},
                         edges, nodes, name=name, origin=f"parquet:{url}")


def _filesystem(url: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as err:
        raise MissingBackendError(f"SOURCE parquet:{url}: {err}; pip install the fsspec backend it names "
                                  "(s3fs for s3://, gcsfs for gs://)") from err


def _dataset(fs: Any, root: str, kind: str, required: bool) -> tuple[list[Piece], Any]:
    """The row groups of ``root/kind/*.parquet`` in file-name order, and the files' common Arrow schema."""
    import pyarrow.parquet as pq

    folder = f"{root.rstrip('/')}/{kind}"
    if not fs.isdir(folder):
        if required:
            raise SourceNotFoundError(f"SOURCE parquet:{root}: no {kind} directory {folder}; expected {LAYOUT}")
        return [], None
    entries = fs.ls(folder, detail=True)
    if any(e["type"] == "directory" for e in entries):
        raise InvalidInputError(f"{folder} holds subdirectories: the heterogeneous layout ({kind}/<type>/) is not "
                                f"supported yet by parquet:; give one homogeneous graph as {LAYOUT}")
    files = sorted(e["name"] for e in entries if e["name"].endswith(".parquet"))
    if not files:
        raise SourceNotFoundError(f"{folder} holds no .parquet file; expected {LAYOUT}")
    pieces, schema = [], None
    for path in files:
        with fs.open(path, "rb") as fh:
            meta = _footer(pq, fh, path)
            differ = schema_difference(schema, meta.schema_arrow, files[0], path) if schema is not None else ""
            if differ:
                raise InvalidInputError(f"{files[0]} and {path} have different columns ({differ}); write every "
                                        f"{kind} file with the same columns and types")
            schema = schema if schema is not None else meta.schema_arrow
            pieces += [Piece(path, i, meta.metadata.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return pieces, schema


def _footer(pq: Any, fh: Any, path: str) -> Any:
    import pyarrow as pa

    try:
        return pq.ParquetFile(fh)
    except (pa.ArrowInvalid, OSError) as err:
        raise InvalidInputError(f"{path} is not a readable Parquet file ({err}); rewrite it with "
                                "pandas.DataFrame.to_parquet or pyarrow.parquet.write_table, or remove it") from err


def _columns(fs: Any, pieces: list[Piece], arrow: Any, keys: tuple[str, ...],
             kind: str) -> tuple[dict[str, str], dict[str, ColumnSchema]]:
    """``({column: attribute}, {attribute: schema})`` of a dataset's non-key columns, keys checked."""
    where = pieces[0].path
    for key in keys:
        if key not in arrow.names:
            raise InvalidInputError(f"{where}: the {kind} files have no {key!r} column (columns: {arrow.names}); "
                                    f"expected {LAYOUT}")
        if not np.issubdtype(np.dtype(column_schema(arrow.field(key).type, key, where, None).dtype), np.integer):
            raise InvalidInputError(f"{where}: column {key!r} has type {arrow.field(key).type}; node IDs must be "
                                    "integers: cast it to int64")
    names = attr_names(arrow.names, keys, where)
    schema = {}
    for col, name in names.items():
        kind_ = arrow.field(col).type
        width = _first_width(fs, pieces, col) if is_list_column(kind_) else None
        schema[name] = column_schema(kind_, col, where, width)
    return names, schema


def _first_width(fs: Any, pieces: list[Piece], column: str) -> int:
    """The row length of a variable-size list column, from the first non-empty row group."""
    for piece in pieces:
        if piece.rows:
            return list_width(piece.read(fs, [column]).column(column).combine_chunks(), column, piece.where())
    return 0


def _node_ids(fs: Any, pieces: list[Piece]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The sorted original node IDs of a nodes dataset, and the (lowest, highest) remapped ID of each
    row group; a duplicate ID is an error naming where it occurs."""
    per_piece = [to_numpy(p.read(fs, [ID_COLUMN]).column(ID_COLUMN), ID_COLUMN, ColumnSchema("<i8"), p.where())
                 for p in pieces]
    ids = np.sort(np.concatenate(per_piece)) if per_piece else np.empty(0, np.int64)
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        value = ids[dup[0]]
        places = [p.where() for p, got in zip(pieces, per_piece) if (got == value).any()]
        raise InvalidInputError(f"node id {int(value)} appears more than once in the nodes dataset (in "
                                f"{', '.join(places)}); every node needs one row: drop the duplicates")
    spans = []
    for got in per_piece:
        rank = np.searchsorted(ids, got)
        spans.append((int(rank.min()), int(rank.max())) if rank.size else (1, 0))
    return ids, spans


def _endpoint_ids(fs: Any, pieces: list[Piece]) -> np.ndarray:
    """The sorted union of all ``src`` and ``dst`` values (no nodes dataset), one row group at a time;
    row groups' unique values are merged in batches (at most about twice the node count held at once)."""
    ids, pending, held = np.empty(0, np.int64), [], 0
    for p in pieces:
        table = p.read(fs, list(EDGE_KEYS))
        pending.append(np.unique(np.concatenate([to_numpy(table.column(k), k, ColumnSchema("<i8"), p.where())
                                                 for k in EDGE_KEYS])))
        held += len(pending[-1])
        if held > max(len(ids), UNION_BATCH):
            ids, pending, held = np.unique(np.concatenate([ids, *pending])), [], 0
    return np.unique(np.concatenate([ids, *pending]))


def _node_chunks(fs: Any, pieces: list[tuple[Piece, tuple[int, int]]], ids: np.ndarray,
                 cols: tuple[dict[str, str], dict[str, ColumnSchema]]) -> list[ParquetNodeChunk]:
    """Chunks of consecutive remapped IDs, each listing the row groups that hold any of its IDs."""
    step = max([NODE_CHUNK_MIN, *(p.rows for p, _ in pieces)])
    chunks = []
    for lo in range(0, len(ids), step):
        hi = min(lo + step, len(ids))
        mine = tuple(p for p, (a, b) in pieces if a < hi and b >= lo)
        chunks.append(ParquetNodeChunk(fs, mine, ids, cols[0], cols[1], lo, hi))
    return chunks
