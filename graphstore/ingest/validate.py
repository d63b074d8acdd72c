"""Check a graph before anything is written: IDs in range, row counts, dtypes, names, partition count."""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.dataset.trainable import class_limit
from graphstore.errors import InvalidInputError
from graphstore.ingest.source import SUPPORTED_DTYPES, EdgeType, GraphSource, NodeType, as_rows

_BLOCK = 1 << 24
_LABEL_BLOCK = 1 << 20  # rows of y and the masks read at a time by the label check
SPLIT_MASKS = ("train_mask", "val_mask", "test_mask")  # the masks under which training reads labels
BYTES_PER_NODE = 32  # per-node maps ingest holds (partition, relabelling, degree, isolated-node flags)
BYTES_PER_EDGE = 40  # per stored edge: endpoints, sort key, permutation, scratch (docs/ingest.md: Memory follows the budget)


def _where_node(ntype: NodeType) -> str:
    return "the nodes" if ntype is None else f"node type {ntype!r}"


def _where_edge(etype: EdgeType) -> str:
    return "the edges" if etype is None else f"edge type {etype!r}"


def validate_source(source: GraphSource, num_parts: int) -> None:
    """Raise :class:`InvalidInputError` naming the first problem that would make the dataset wrong.

    Self-loops, duplicate edges and isolated nodes are valid (kept, counted in the manifest), and so
    is a negative label ``y`` on a node outside every split mask (unlabelled); inside one it is refused.
    """
    check_counts({t: n.num_nodes for t, n in source.nodes.items()}, {})
    total_nodes = sum(t.num_nodes for t in source.nodes.values())
    if not source.nodes or total_nodes == 0:
        raise InvalidInputError("the graph has no nodes; give at least one node type with num_nodes > 0 "
                                "(an edge list, or num_nodes)")
    _check_types_and_parts(source.nodes, source.edges, num_parts, total_nodes)
    for ntype, table in source.nodes.items():
        _check_node_table(ntype, table.num_nodes, table.attrs)
        _check_source_labels(_where_node(ntype), table.num_nodes, table.attrs)
    check_fits_memory(f"the node ID range ({total_nodes:,} nodes)", total_nodes * BYTES_PER_NODE,
                      "node IDs must be 0..N-1: remap them to consecutive IDs (np.unique(ids, return_inverse=True)), "
                      "or give num_nodes if the graph really has that many nodes")
    if sum(t.num_edges for t in source.edges.values()) == 0:
        raise InvalidInputError("the edge list is empty: a graph dataset needs at least one edge")
    for etype, table in source.edges.items():
        _check_edge_table(source, etype)


def check_options(*, seed: object, chunk_mb: object, metis_max_edges: object) -> None:
    """The numeric options of ingest: integers and finite numbers in range, before anything is read."""
    if not _is_int(seed) or not 0 <= seed < 2**63:  # type: ignore[operator]
        raise InvalidInputError(f"--seed {seed!r} is invalid: give an integer in [0, 2**63)")
    if isinstance(chunk_mb, bool) or not isinstance(chunk_mb, (int, float, np.number)) or \
            not math.isfinite(chunk_mb) or not 0 < chunk_mb <= 1024:
        raise InvalidInputError(f"--chunk-mb {chunk_mb!r} is invalid: give a finite size in MB in (0, 1024]")
    if metis_max_edges is not None and (not _is_int(metis_max_edges) or metis_max_edges < 0):  # type: ignore
        raise InvalidInputError(f"--metis-max-edges {metis_max_edges!r} is invalid: give an integer >= 0 (0 = all)")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_counts(num_nodes: dict, num_edges: dict) -> None:
    """Every node and edge count an integer >= 0, checked before anything is derived from them."""
    for kind, counts, where in (("num_nodes", num_nodes, _where_node), ("num_edges", num_edges, _where_edge)):
        for key, count in counts.items():
            if not _is_int(count) or count < 0:  # type: ignore[operator]
                raise InvalidInputError(f"{where(key)}: {kind} is {count!r}, but a count must be an integer >= 0; "
                                        f"give the real number of {kind[4:]}")


def _check_node_table(ntype: NodeType, num_nodes: int, attrs: dict) -> None:
    where = _where_node(ntype)
    if ntype is not None:
        layout.check_attr_name(ntype, "a node type")
    for name, rows in attrs.items():
        layout.check_attr_name(name, where)
        if name == layout.ORIG_ID:
            raise InvalidInputError(f"{where}: attribute name {name!r} is reserved for the input IDs; rename it")
        _check_rows(f"{where}, attribute {name!r}", rows, num_nodes, "num_nodes")
        check_node_attr(f"{where}, attribute {name!r}", name, rows)


def check_node_attr(where: str, name: str, rows: object) -> None:
    """The meaning of well-known node attributes: ``x`` is 2-D, ``y`` integer labels, ``*_mask`` bool."""
    shape, dtype = tuple(rows.shape), np.dtype(rows.dtype)  # type: ignore[attr-defined]
    if name == "x" and len(shape) != 2:
        raise InvalidInputError(f"{where} has shape {list(shape)}; features must be 2-D [num_nodes, width]: "
                                "reshape them (x.reshape(len(x), -1))")
    if name == "x" and shape[1] == 0:
        raise InvalidInputError(f"{where} has shape {list(shape)}: features of width 0 give a model no input; "
                                "give x with at least one column, or leave x out")
    if name == "y" and (dtype.kind not in "iu" or len(shape) > 2):
        raise InvalidInputError(f"{where} has dtype {dtype} and shape {list(shape)}; labels must be integer class "
                                "IDs, 1-D (or 2-D for multi-label): convert them (y.astype(np.int64))")
    if name.endswith("_mask") and (dtype != np.bool_ or len(shape) != 1):
        raise InvalidInputError(f"{where} has dtype {dtype} and shape {list(shape)}; masks must be 1-D bool (one "
                                "flag per node): convert them (mask.astype(bool), or mask == 1)")


def check_labels(where: str, y: np.ndarray, masks: dict[str, np.ndarray], first: int) -> None:
    """Refuse a negative label ``y`` on a node some split mask holds (``first``: input ID of row 0)."""
    bad = _bad_label_rows(y, masks)
    if len(bad):
        raise _label_error(where, y, masks, int(bad[0]), first, len(bad), f"nodes {first}..{first + len(y) - 1}")


def _check_source_labels(where: str, num_nodes: int, attrs: dict) -> None:
    """:func:`check_labels` over a whole node table, read in blocks; the error counts every bad node. Also
    what ``graphstore verify`` and the training door refuse (:mod:`graphstore.dataset.trainable`): more
    classes than a model can hold, a ``train_mask`` that holds no node."""
    names = [n for n in SPLIT_MASKS if n in attrs]
    if "y" not in attrs or np.dtype(attrs["y"].dtype).kind not in "iu":
        return
    found, count, largest, train = None, 0, (-1, 0), 0
    for start in range(0, num_nodes, _LABEL_BLOCK):
        rows = np.arange(start, min(start + _LABEL_BLOCK, num_nodes), dtype=np.int64)
        y = np.asarray(as_rows(attrs["y"]).take(rows))
        masks = {n: np.asarray(as_rows(attrs[n]).take(rows)) for n in names}
        bad = _bad_label_rows(y, masks)
        if len(bad) and found is None:
            found = (y, masks, int(bad[0]), start)
        count += len(bad)
        flat = y.reshape(len(y), -1)
        if flat.size and int(flat.max()) > largest[0]:
            largest = (int(flat.max()), start + int(np.argmax(flat.max(axis=1))))
        train += int(np.count_nonzero(masks["train_mask"])) if "train_mask" in masks else 0
    if found is not None and np.dtype(attrs["y"].dtype).kind == "i":
        y, masks, row, start = found
        raise _label_error(where, y, masks, row, start, count, f"all {num_nodes:,} nodes")
    if largest[0] + 1 > class_limit(num_nodes):
        raise InvalidInputError(f"{where}, attribute 'y': node {largest[1]} has label {largest[0]:,}, so a model would "
                                f"need {largest[0] + 1:,} output classes, more than it can hold "
                                f"({class_limit(num_nodes):,} for {num_nodes:,} nodes); number the classes 0..C-1 "
                                "(np.unique(y, return_inverse=True))")
    if "train_mask" in names and train == 0 and num_nodes:
        raise InvalidInputError(f"{where}, attribute 'train_mask': no node is in it, so training would have nothing "
                                "to train on; mark the training nodes, or leave train_mask out")


def _bad_label_rows(y: np.ndarray, masks: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose label (any entry, for multi-label ``y``) is negative while a split mask holds them."""
    y = np.asarray(y)
    names = [n for n in SPLIT_MASKS if n in masks]
    if y.dtype.kind != "i" or not names or not len(y):
        return np.zeros(0, np.int64)
    held = np.logical_or.reduce([np.asarray(masks[n], dtype=bool) for n in names])
    return np.flatnonzero(held & (y.reshape(len(y), -1) < 0).any(axis=1))


def _label_error(where: str, y: np.ndarray, masks: dict[str, np.ndarray], row: int, first: int, count: int,
                 among: str) -> InvalidInputError:
    mask = next(n for n in SPLIT_MASKS if n in masks and masks[n][row])
    values = np.asarray(y[row]).reshape(-1)
    return InvalidInputError(
        f"{where}, attribute 'y': node {first + row} is in {mask} but has label {int(values[values < 0][0])} "
        f"({count:,} such node{'s' if count > 1 else ''} among {among}); class IDs must be >= 0 wherever "
        "train_mask/val_mask/test_mask holds the node: fix those labels, or take the nodes out of the masks "
        "(a negative label outside every mask means unlabelled)")


def agreed_node_count(where: str, rows: dict[str, int], needed: int, fix: str) -> int:
    """The row count the node attributes ``rows`` (name -> rows) agree on, used as the node count when none
    is given; refuses naming each attribute that disagrees. Ties go to the smallest count that holds
    ``needed`` (the largest node ID + 1)."""
    tally = Counter(rows.values())
    best = max(tally, key=lambda n: (tally[n], n >= needed, -n))
    odd = [name for name, n in rows.items() if n != best]
    if odd:
        same = [repr(name) for name, n in rows.items() if n == best]
        raise InvalidInputError(
            f"{where}: node attribute{'s' if len(odd) > 1 else ''} "
            f"{' and '.join(f'{name!r} has {rows[name]} rows' for name in odd)}, but {', '.join(same)} "
            f"{'has' if len(same) == 1 else 'have'} {best}: give every node attribute one row per node ({fix})")
    return best


def available_memory() -> int:
    """Bytes this machine can still give (``MemAvailable``; physical memory where that is unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_fits_memory(what: str, nbytes: int, fix: str) -> None:
    """Refuse work whose per-element arrays alone would need more memory than this machine has."""
    if nbytes > available_memory():
        raise InvalidInputError(f"{what} would need about {nbytes / 1e9:,.1f} GB of memory at ingest, more than "
                                f"the {available_memory() / 1e9:,.1f} GB available; {fix}")


def _check_rows(where: str, rows: object, expected: int, what: str) -> None:
    shape, dtype = tuple(rows.shape), np.dtype(rows.dtype)  # type: ignore[attr-defined]
    if not shape or shape[0] != expected:
        raise InvalidInputError(
            f"{where} has {shape[0] if shape else 'no'} rows but {what} is {expected}; "
            "give exactly one row per element (shape [count, ...])"
        )
    if dtype not in SUPPORTED_DTYPES:
        allowed = sorted(d.name for d in SUPPORTED_DTYPES)
        raise InvalidInputError(f"{where} has dtype {dtype}, which cannot be stored; convert it to one of {allowed}")


def _check_edge_table(source: GraphSource, etype: EdgeType) -> None:
    table, where = source.edges[etype], _where_edge(etype)
    if etype is not None:
        if len(etype) != 3 or etype[0] not in source.nodes or etype[2] not in source.nodes:
            raise InvalidInputError(
                f"{where} must be (src_type, relation, dst_type) with both node types in {list(source.nodes)}"
            )
        layout.check_attr_name(etype[1], "an edge relation")
    s_type, d_type = (None, None) if etype is None else (etype[0], etype[2])
    for end, ids, ntype in (("source", table.src, s_type), ("destination", table.dst, d_type)):
        _check_ids(f"{where}, {end} IDs", np.asarray(ids), source.nodes[ntype].num_nodes, table.num_edges)
    for name, rows in table.attrs.items():
        layout.check_attr_name(name, where)
        if name in layout.TOPOLOGY:
            raise InvalidInputError(f"{where}: attribute name {name!r} is reserved for the graph topology "
                                    f"({sorted(layout.TOPOLOGY)}); rename it")
        _check_rows(f"{where}, attribute {name!r}", rows, table.num_edges, "the edge count")


def _check_ids(where: str, ids: np.ndarray, num_nodes: int, num_edges: int) -> None:
    if ids.ndim != 1 or len(ids) != num_edges:
        raise InvalidInputError(f"{where}: expected a 1-D array of {num_edges} IDs, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise InvalidInputError(f"{where} have dtype {ids.dtype}; node IDs must be integers")
    for start in range(0, len(ids), _BLOCK):
        block = ids[start: start + _BLOCK]
        bad = np.flatnonzero((block < 0) | (block >= num_nodes))
        if len(bad):
            i = start + int(bad[0])
            raise InvalidInputError(
                f"{where}: edge {i} has node ID {int(ids[i])}, outside [0, {num_nodes}) "
                f"({int(np.count_nonzero((ids < 0) | (ids >= num_nodes)))} such edges); node IDs must be "
                "0-based and below the node count (give num_nodes explicitly if nodes are missing)"
            )


def read_edge_block(chunk: Any, num_src: int, num_dst: int) -> Any:
    """Read one edge chunk and check it: one row per edge in every array, integer IDs in range.

    Errors name the edge by its number in the input edge list (``chunk.start + row``).
    """
    block = chunk.read()
    where, count = _where_edge(chunk.etype), chunk.stop - chunk.start
    for end, ids, num_nodes in (("source", block.src, num_src), ("destination", block.dst, num_dst)):
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) != count:
            raise InvalidInputError(f"{where}, {end} IDs of edges {chunk.start}..{chunk.stop - 1}: expected a 1-D "
                                    f"array of {count} IDs, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InvalidInputError(f"{where}, {end} IDs have dtype {ids.dtype}; node IDs must be integers")
        bad = np.flatnonzero((ids < 0) | (ids >= num_nodes))
        if len(bad):
            i = int(bad[0])
            raise InvalidInputError(
                f"{where}, {end} IDs: edge {chunk.start + i} has node ID {int(ids[i])}, outside [0, {num_nodes}) "
                f"({len(bad)} such edges among edges {chunk.start}..{chunk.stop - 1}); node IDs must be 0-based "
                "and below the node count (give num_nodes explicitly if nodes are missing)"
            )
    for name, rows in block.attrs.items():
        if len(rows) != count:
            raise InvalidInputError(f"{where}, attribute {name!r} has {len(rows)} rows for edges {chunk.start}.."
                                    f"{chunk.stop - 1} ({count} edges); give exactly one row per edge")
    return block


class _Declared:
    """The shape and dtype a chunked source declares for one attribute (what the checks above read)."""

    def __init__(self, rows: int, schema: Any) -> None:
        self.shape, self.dtype = (rows, *schema.shape), np.dtype(schema.dtype)


def validate_chunked(source: Any, num_parts: int) -> None:
    """:func:`validate_source` for a :class:`~graphstore.ingest.chunks.ChunkedSource`: everything its
    declared counts and schemas tell. IDs and row counts are checked as each chunk is read."""
    check_counts(source.num_nodes, source.num_edges)
    total_nodes = sum(source.num_nodes.values())
    if not source.num_nodes or total_nodes == 0:
        raise InvalidInputError("the graph has no nodes; give at least one node type with num_nodes > 0 "
                                "(an edge list, or num_nodes)")
    _check_types_and_parts(source.num_nodes, source.num_edges, num_parts, total_nodes)
    for ntype, count in source.num_nodes.items():
        schema = source.node_schema.get(ntype, {})
        _check_node_table(ntype, count, {n: _Declared(count, s) for n, s in schema.items()})
    check_fits_memory(f"the node ID range ({total_nodes:,} nodes)", total_nodes * BYTES_PER_NODE,
                      "node IDs must be 0..N-1: remap them to consecutive IDs (np.unique(ids, return_inverse=True)), "
                      "or give num_nodes if the graph really has that many nodes")
    if sum(source.num_edges.values()) == 0:
        raise InvalidInputError("the edge list is empty: a graph dataset needs at least one edge")
    for etype, count in source.num_edges.items():
        _check_edge_schema(source, etype, count)


def _check_edge_schema(source: Any, etype: EdgeType, count: int) -> None:
    where = _where_edge(etype)
    if etype is not None:
        if len(etype) != 3 or etype[0] not in source.num_nodes or etype[2] not in source.num_nodes:
            raise InvalidInputError(
                f"{where} must be (src_type, relation, dst_type) with both node types in {list(source.num_nodes)}"
            )
        layout.check_attr_name(etype[1], "an edge relation")
    for name, schema in source.edge_schema.get(etype, {}).items():
        layout.check_attr_name(name, where)
        if name in layout.TOPOLOGY:
            raise InvalidInputError(f"{where}: attribute name {name!r} is reserved for the graph topology "
                                    f"({sorted(layout.TOPOLOGY)}); rename it")
        _check_rows(f"{where}, attribute {name!r}", _Declared(count, schema), count, "the edge count")


def check_finite_rows(where: str, name: str, values: np.ndarray, first: int) -> None:
    """Refuse NaN/inf in a float attribute's rows (``first``: the input number of the first row)."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return
    bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
    if len(bad):
        raise InvalidInputError(f"{where}, attribute {name!r}: row {first + int(bad[0])} holds NaN or inf; clean "
                                "the data, or pass --allow-nan (allow_nan=True) to store it as is")


def _check_types_and_parts(node_types: Any, edge_types: Any, num_parts: Any, total_nodes: int) -> None:
    """One graph kind (homogeneous or typed) and a partition count every part can get nodes for."""
    if (None in node_types) != (None in edge_types) or (None in node_types and len(node_types) > 1):
        raise InvalidInputError("mix of homogeneous (type None) and typed nodes/edges; use one or the other")
    if not isinstance(num_parts, (int, np.integer)) or isinstance(num_parts, bool) or num_parts < 1:
        raise InvalidInputError(f"--parts {num_parts!r} is invalid: the partition count must be an integer >= 1")
    if num_parts > total_nodes:
        raise InvalidInputError(
            f"--parts {num_parts} is larger than the node count {total_nodes}: every partition needs nodes; "
            f"use --parts {max(1, min(total_nodes, 8))} or fewer"
        )
