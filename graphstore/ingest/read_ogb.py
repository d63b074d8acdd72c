"""Read an OGB node-property dataset from its raw gzip CSV layout, features spilled to a memmap."""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
import zlib
from collections.abc import Iterator

import numpy as np
import pandas as pd

from graphstore.errors import InvalidInputError, SourceNotFoundError
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable, RowSource

logger = logging.getLogger(__name__)

# datasets OGB stores one direction of and loads with inverse edges added
UNDIRECTED_DATASETS = frozenset({"ogbn_products", "ogbn-products", "ogbn_proteins", "ogbn-proteins"})
SPLIT_MASKS = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}
RAW_FILES = ("edge.csv.gz", "num-node-list.csv.gz", "node-feat.csv.gz", "node-label.csv.gz", "edge-feat.csv.gz")
_CHUNK_ELEMENTS = 1 << 22  # values parsed per pandas chunk: bounds the memory of feature parsing
_EDGE_CHUNK_ROWS = 1 << 20
_BAD_GZIP = (gzip.BadGzipFile, EOFError, zlib.error)


def read_ogb(
    directory: str,
    to_undirected: bool | None = None,
    scratch_dir: str | None = None,
    split_scheme: str | None = None,
) -> GraphSource:
    """Read an OGB node-property dataset (``ogbn-arxiv``, ``ogbn-products``, ...) from raw CSVs.

    Reads ``raw/edge.csv.gz`` (``src,dst`` lines), and if present ``raw/num-node-list.csv.gz``,
    ``raw/node-feat.csv.gz`` (attribute ``x``, float32), ``raw/node-label.csv.gz`` (``y``, int64,
    ``nan`` stored as -1), ``raw/edge-feat.csv.gz`` (edge attribute ``edge_attr``, float32) and
    ``split/<scheme>/{train,valid,test}.csv.gz`` (``train_mask``/``val_mask``/``test_mask``).
    CSVs are parsed in bounded chunks; features go to ``.npy`` memmaps in a temporary directory
    deleted by ``GraphSource.close()``, so memory stays bounded for ogbn-products-size features.
    Edges are held in memory as int64 arrays.

    Parameters
    ----------
    directory : str
        The dataset directory (holding ``raw/`` and optionally ``split/``), as OGB extracts it.
    to_undirected : bool, optional
        Append the reversed edges (edge features repeated for them). None infers it from the
        directory name: True for ``ogbn_products`` and ``ogbn_proteins``, False otherwise.
    scratch_dir : str, optional
        Where the temporary feature directory is made; default: the system temp directory.
    split_scheme : str, optional
        The ``split/<scheme>`` directory to read; needed only if there are several.

    Returns
    -------
    GraphSource
        Homogeneous, named after the directory, with origin ``"ogb:<directory>"``.

    Raises
    ------
    SourceNotFoundError
        If ``directory`` or ``raw/edge.csv.gz`` does not exist, or a requested split is missing.
    InvalidInputError
        If a CSV cannot be parsed, a feature file has more rows than nodes/edges, a split index is
        out of range, or several split schemes exist and ``split_scheme`` is None.

    Examples
    --------
    >>> with read_ogb("data/ogbn_arxiv") as source:  # doctest: +SKIP
    ...     source.nodes[None].attrs["x"].shape
    (169343, 128)
    """
    raw = _raw_dir(directory)
    name = os.path.basename(os.path.normpath(directory))
    undirected = name in UNDIRECTED_DATASETS if to_undirected is None else to_undirected
    splits = _split_files(directory, split_scheme)
    _log_unread(raw)
    src, dst, num_read = _read_edges(os.path.join(raw, "edge.csv.gz"), undirected)
    source = GraphSource(nodes={}, edges={}, name=name, origin=f"ogb:{directory}")
    try:
        scratch = _scratch(source, raw, scratch_dir)
        listed = _read_num_nodes(os.path.join(raw, "num-node-list.csv.gz"))
        node_attrs = _node_attrs(raw, scratch, listed)
        edge_attrs = _edge_attrs(raw, scratch, num_read, undirected)
        num_nodes = listed if listed is not None else _inferred_num_nodes(src, dst, node_attrs)
        node_attrs.update({mask: ArrayRows(_read_mask(path, num_nodes)) for mask, path in splits.items()})
    except BaseException:
        source.close()
        raise
    source.nodes[None] = NodeTable(num_nodes, node_attrs)
    source.edges[None] = EdgeTable(src, dst, edge_attrs)
    logger.info("read OGB %r: %d nodes, %d edges (undirected=%s), node attrs %s",
                name, num_nodes, len(src), undirected, sorted(node_attrs))
    return source


class MirroredRows:
    """Rows ``0..n-1`` of ``base`` followed by the same rows again: attributes of appended reverse edges."""

    def __init__(self, base: RowSource) -> None:
        self._base = base
        self._n = base.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return (2 * self._n, *self._base.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        return self._base.take(rows % self._n if self._n else rows)


def _raw_dir(directory: str) -> str:
    """``directory/raw``, after checking it holds ``edge.csv.gz``."""
    if not os.path.isdir(directory):
        raise SourceNotFoundError(
            f"OGB directory {directory!r} does not exist; expected a dataset directory with raw/edge.csv.gz"
        )
    raw = os.path.join(directory, "raw")
    if not os.path.isfile(os.path.join(raw, "edge.csv.gz")):
        hetero = os.path.isdir(os.path.join(raw, "relations"))
        hint = ("heterogeneous OGB datasets (ogbn-mag) are not read from raw CSVs: load them with PyG "
                "(torch_geometric.datasets.OGB_MAG) and use from_pyg" if hetero else
                "pass the dataset directory that holds raw/ (as OGB extracts it)")
        raise SourceNotFoundError(f"{os.path.join(raw, 'edge.csv.gz')!r} does not exist; {hint}")
    return raw


def _scratch(source: GraphSource, raw: str, scratch_dir: str | None) -> str | None:
    """A fresh temporary directory (deleted on close) if there are features to spill, else None."""
    if not any(os.path.isfile(os.path.join(raw, f)) for f in ("node-feat.csv.gz", "edge-feat.csv.gz")):
        return None
    if scratch_dir is not None and not os.path.isdir(scratch_dir):
        raise SourceNotFoundError(f"scratch_dir {scratch_dir!r} does not exist; create it or omit scratch_dir")
    path = tempfile.mkdtemp(prefix="graphstore-ogb-", dir=scratch_dir)
    source.add_temp_dir(path)
    return path


def _node_attrs(raw: str, scratch: str | None, listed: int | None) -> dict[str, RowSource]:
    """``x`` and ``y`` from ``node-feat`` and ``node-label``, when present."""
    attrs: dict[str, RowSource] = {}
    feat = os.path.join(raw, "node-feat.csv.gz")
    if scratch is not None and os.path.isfile(feat):
        what = "num-node-list.csv.gz nodes"
        attrs["x"] = ArrayRows(_csv_to_npy(feat, os.path.join(scratch, "x.npy"), listed, what))
    label = os.path.join(raw, "node-label.csv.gz")
    if os.path.isfile(label):
        attrs["y"] = ArrayRows(_read_labels(label))
    return attrs


def _edge_attrs(raw: str, scratch: str | None, num_read: int, undirected: bool) -> dict[str, RowSource]:
    """``edge_attr`` from ``edge-feat``, repeated for the reverse edges when ``undirected``."""
    feat = os.path.join(raw, "edge-feat.csv.gz")
    if scratch is None or not os.path.isfile(feat):
        return {}
    array = _csv_to_npy(feat, os.path.join(scratch, "edge_attr.npy"), num_read, "edge.csv.gz edges")
    if not undirected:
        return {"edge_attr": ArrayRows(array)}
    if len(array) != num_read:
        raise InvalidInputError(
            f"{feat!r} has {len(array)} rows but edge.csv.gz has {num_read} edges; cannot repeat edge features "
            "for reverse edges: fix the file or pass to_undirected=False"
        )
    return {"edge_attr": MirroredRows(ArrayRows(array))}


def _inferred_num_nodes(src: np.ndarray, dst: np.ndarray, node_attrs: dict[str, RowSource]) -> int:
    """Without ``num-node-list``: the largest edge endpoint plus one, or more rows of node data."""
    candidates = [attr.shape[0] for attr in node_attrs.values()]
    if len(src):
        candidates.append(int(max(src.max(), dst.max())) + 1)
    num_nodes = max(candidates, default=0)
    logger.info("no num-node-list.csv.gz: inferred %d nodes from edges and node files", num_nodes)
    return num_nodes


def _iter_csv(path: str, dtype: type, chunk_rows: int) -> Iterator[np.ndarray]:
    """2-d arrays of ``chunk_rows`` lines of a headerless gzip CSV; parse errors name the file."""
    try:
        with pd.read_csv(path, header=None, dtype=dtype, chunksize=chunk_rows, engine="c",
                         compression="gzip") as reader:
            for frame in reader:
                yield frame.to_numpy(dtype=dtype)
    except pd.errors.EmptyDataError:
        return
    except (ValueError, *_BAD_GZIP) as err:  # pandas' ParserError is a ValueError
        raise InvalidInputError(
            f"cannot parse {path!r} as a headerless gzip CSV of {np.dtype(dtype)} values: {err}; "
            "re-download or re-extract the dataset"
        ) from err
    except OSError as err:
        raise SourceNotFoundError(f"cannot read {path!r}: {err}") from err


def _read_edges(path: str, undirected: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """``(src, dst, edges in the file)``; with ``undirected`` the reversed edges follow the read ones."""
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    for chunk in _iter_csv(path, np.int64, _EDGE_CHUNK_ROWS):
        if chunk.shape[1] != 2:
            raise InvalidInputError(f"{path!r} has {chunk.shape[1]} columns; expected 2 (src,dst) per line")
        srcs.append(chunk[:, 0].copy())
        dsts.append(chunk[:, 1].copy())
    num = sum(len(part) for part in srcs)
    src = np.empty(2 * num if undirected else num, dtype=np.int64)
    dst = np.empty_like(src)
    for parts, out in ((srcs, src), (dsts, dst)):  # fill, then free the chunks: peak ~ the result
        if parts:
            np.concatenate(parts, out=out[:num])
        parts.clear()
    if undirected:
        src[num:], dst[num:] = dst[:num], src[:num]
    logger.info("read %d edges from %s", num, path)
    return src, dst, num


def _read_num_nodes(path: str) -> int | None:
    """The single count in ``num-node-list.csv.gz``, or None if the file is absent."""
    if not os.path.isfile(path):
        return None
    values = np.concatenate([c.ravel() for c in _iter_csv(path, np.int64, 1024)] or [np.empty(0, np.int64)])
    if values.size != 1:
        raise InvalidInputError(
            f"{path!r} holds {values.size} values; a node-property dataset lists one node count "
            "(graph-property and heterogeneous datasets are not read by read_ogb)"
        )
    return int(values[0])


def _read_labels(path: str) -> np.ndarray:
    """Labels as int64 (``nan`` → -1), 1-d for one column, ``(N, k)`` for multi-label data."""
    parts, nan_rows, width = [], [], _first_line_width(path)
    for chunk in _iter_csv(path, np.float64, max(1, _CHUNK_ELEMENTS // max(1, width))):
        _note_nan_rows(chunk, sum(len(p) for p in parts), nan_rows)
        parts.append(np.where(np.isnan(chunk), -1, chunk).astype(np.int64))
    _check_short_rows(path, nan_rows, width)  # a short line is not "no label"
    labels = np.concatenate(parts) if parts else np.empty((0, 1), dtype=np.int64)
    return labels[:, 0] if labels.shape[1] == 1 else labels


def _read_mask(path: str, num_nodes: int) -> np.ndarray:
    """A bool mask of ``num_nodes`` that is True at the node indices listed in ``path``."""
    parts = [chunk.ravel() for chunk in _iter_csv(path, np.int64, _EDGE_CHUNK_ROWS)]
    index = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= num_nodes):
        bad = index.min() if index.min() < 0 else index.max()
        raise InvalidInputError(f"{path!r} lists node {bad}, outside [0, {num_nodes}); fix the split file")
    mask = np.zeros(num_nodes, dtype=bool)
    mask[index] = True
    return mask


def _csv_to_npy(path: str, npy_path: str, rows: int | None, what: str) -> np.ndarray:
    """Parse a float CSV into a float32 ``.npy`` memmap of ``rows`` rows (counted if None); reopen read-only."""
    width = _first_line_width(path)
    if rows is None:
        rows = _count_lines(path)
    if rows == 0 or width == 0:
        return np.zeros((0, width), dtype=np.float32)
    out = np.lib.format.open_memmap(npy_path, mode="w+", dtype=np.float32, shape=(rows, width))
    filled, nan_rows = 0, []
    for chunk in _iter_csv(path, np.float32, max(1, _CHUNK_ELEMENTS // width)):
        if chunk.shape[1] != width:
            raise InvalidInputError(
                f"{path!r} has {chunk.shape[1]} columns after a first line of {width}; fix the file"
            )
        if filled + len(chunk) > rows:
            raise InvalidInputError(f"{path!r} has more than {rows} rows, the number of {what}; fix the file")
        out[filled : filled + len(chunk)] = chunk
        _note_nan_rows(chunk, filled, nan_rows)
        filled += len(chunk)
    out.flush()
    del out
    _check_short_rows(path, nan_rows, width)
    logger.info("spilled %d x %d features of %s to %s", filled, width, path, npy_path)
    array = np.load(npy_path, mmap_mode="r")
    return array if filled == rows else array[:filled]


_MAX_NAN_ROWS = 1 << 20  # rows with NaN whose width is checked (a bound on the memory of the check)


def _note_nan_rows(chunk: np.ndarray, first_row: int, nan_rows: list[np.ndarray]) -> None:
    """Remember the rows of ``chunk`` that hold NaN: pandas fills a short line's missing fields with NaN,
    so only those rows can be short lines (files without NaN cost nothing more)."""
    if sum(len(r) for r in nan_rows) < _MAX_NAN_ROWS:
        rows = np.flatnonzero(np.isnan(chunk).any(axis=1))
        if len(rows):
            nan_rows.append(rows + first_row)


def _check_short_rows(path: str, nan_rows: list[np.ndarray], width: int) -> None:
    """Count the values on the lines whose rows parsed with NaN (one pass, up to the last such line) and
    name the first short one: its NaN came from missing values, not from the data (a real ``nan`` is kept)."""
    if not nan_rows:
        return
    wanted = np.unique(np.concatenate(nan_rows))
    row, k = -1, 0
    with gzip.open(path, "rt") as fh:
        for number, line in enumerate(fh, start=1):
            text = line.strip()
            if not text:
                continue  # pandas skips blank lines: they are not rows
            row += 1
            if row == wanted[k]:
                values = text.count(",") + 1
                if values != width:
                    raise InvalidInputError(
                        f"{path!r} line {number} has {values} values; the first line has {width}: every line needs "
                        "the same number of comma-separated values (fix the file or re-extract the dataset)"
                    )
                k += 1
                if k == len(wanted):
                    return


def _first_line_width(path: str) -> int:
    """The number of comma-separated values on the first line (0 for an empty file)."""
    try:
        with gzip.open(path, "rt") as fh:
            line = fh.readline().strip()
    except _BAD_GZIP as err:
        raise InvalidInputError(f"{path!r} is not a valid gzip file: {err}; re-download the dataset") from err
    return line.count(",") + 1 if line else 0


def _count_lines(path: str) -> int:
    """Lines of a gzip text file, streamed in blocks (a last line without newline counts)."""
    count, last = 0, b"\n"
    try:
        with gzip.open(path, "rb") as fh:
            while block := fh.read(1 << 24):
                count += block.count(b"\n")
                last = block[-1:]
    except _BAD_GZIP as err:
        raise InvalidInputError(f"{path!r} is not a valid gzip file: {err}; re-download the dataset") from err
    return count + (last != b"\n")


def _split_files(directory: str, split_scheme: str | None) -> dict[str, str]:
    """``{mask name: split file}`` of the chosen (or only) split scheme; empty without ``split/``."""
    root = os.path.join(directory, "split")
    schemes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) if os.path.isdir(root) else []
    if split_scheme is None:
        if len(schemes) > 1:
            raise InvalidInputError(
                f"{root!r} holds several split schemes {schemes}; keep only the one to use there (move the "
                "others away), or from Python: graphstore.ingest(read_ogb(DIR, split_scheme=...), DEST) with "
                "read_ogb from graphstore.ingest.read_ogb")
        if not schemes:
            logger.warning("%s has no split/<scheme> directory: no train/val/test masks", directory)
            return {}
        split_scheme = schemes[0]
    elif split_scheme not in schemes:
        raise SourceNotFoundError(f"split scheme {split_scheme!r} not found in {root!r}; available: {schemes}")
    files = {mask: os.path.join(root, split_scheme, f"{part}.csv.gz") for mask, part in SPLIT_MASKS.items()}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if missing:
        raise SourceNotFoundError(
            f"split scheme {split_scheme!r} lacks {missing}; expected train, valid and test .csv.gz"
        )
    return files


def _log_unread(raw: str) -> None:
    """Say which raw files read_ogb does not turn into attributes (e.g. ``node_year``, ``node_species``)."""
    unread = sorted(set(os.listdir(raw)) - set(RAW_FILES))
    if unread:
        logger.warning("read_ogb does not read %s in %s", unread, raw)
