"""What training reads from a dataset, checked from its stored arrays: labels, splits, features and topology.

The training door (``training.launcher.checks``) and ``graphstore verify`` call the same functions, so a dataset
that verifies is one training accepts; ingest refuses sources that would fail them
(:mod:`graphstore.ingest.validate`). Each problem is one line naming the node type, the array and the
first bad row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

import numpy as np

from graphstore.dataset import layout
from graphstore.dataset.manifest import Manifest, NodeTypeInfo
from graphstore.storage.integrity import csc_problem


class Dataset(Protocol):
    """What these checks read of an opened dataset (:class:`graphstore.dataset.opened.Dataset`)."""

    manifest: Manifest

    @property
    def num_parts(self) -> int: ...

    def array(self, path: str) -> Any: ...

MAX_CLASSES = 1_000_000  # a 1M-class output layer at hidden 128 is 0.5 GB of weights (1.5 GB with Adam's state)
MIN_CLASS_LIMIT = 1_024  # small graphs may number their classes sparsely
SPLIT_MASKS = ("train_mask", "val_mask", "test_mask")  # the masks under which training reads labels
_BLOCK = 1 << 22  # rows of y and the masks read at a time


def class_limit(num_nodes: int) -> int:
    """The most classes a node type of ``num_nodes`` nodes may have: one per node (at least
    :data:`MIN_CLASS_LIMIT`), never more than :data:`MAX_CLASSES`."""
    return min(MAX_CLASSES, max(int(num_nodes), MIN_CLASS_LIMIT))


def node_name(info: NodeTypeInfo) -> str:
    return f"node type {info.name!r}" if info.name is not None else "the nodes"


def is_labelled(info: NodeTypeInfo) -> bool:
    """Whether ``--task node`` can classify this type: integer labels ``y`` and a bool ``train_mask``."""
    attrs = info.attrs
    return {"y", "train_mask"} <= set(attrs) and np.dtype(attrs["y"].dtype).kind in "iu" and \
        np.dtype(attrs["train_mask"].dtype) == np.bool_


def feature_problem(info: NodeTypeInfo) -> str | None:
    """Features ``x`` of zero width (the manifest alone): a model has no input to read."""
    schema = info.attrs.get("x")
    if schema is None or int(np.prod(schema.shape, dtype=np.int64)) > 0:
        return None
    return (f"{node_name(info)}, array x: the features have width 0 (rows of shape {list(schema.shape)}); a model "
            "needs at least one input column: re-ingest x with columns, or without x")


class _Scan(NamedTuple):
    negative: tuple[str, int, str, int] | None  # array, row, mask, label of the first negative split label
    largest: tuple[str, int, int] | None  # array, row, label of the largest label
    train: int  # nodes in train_mask


def label_problems(ds: Dataset, info: NodeTypeInfo, parts: Iterable[int] | None = None) -> list[str]:
    """Labels ``y`` inside ``[0, classes)`` on every train/val/test node, a class count a model can hold
    (:func:`class_limit`) and at least one node in ``train_mask``, read from the stored arrays of
    ``parts`` (default: all). Empty for a type without integer ``y``."""
    if "y" not in info.attrs or np.dtype(info.attrs["y"].dtype).kind not in "iu":
        return []
    parts = range(ds.num_parts) if parts is None else parts
    scan = _scan(ds, info, parts)
    problems, who = [], node_name(info)
    if scan.negative is not None:
        path, row, mask, label = scan.negative
        problems.append(f"{who}, array {path}: row {row} is in {mask} but has label {label}; labels must lie in "
                        "[0, classes) on every train/val/test node: fix the labels and re-ingest, or take those "
                        "nodes out of the masks (a negative label outside every mask means unlabelled)")
    if scan.largest is not None and scan.largest[2] + 1 > class_limit(info.num_nodes):
        path, row, label = scan.largest
        problems.append(f"{who}, array {path}: row {row} has label {label:,}, so a model would need {label + 1:,} "
                        f"output classes, more than it can hold ({class_limit(info.num_nodes):,} for "
                        f"{info.num_nodes:,} nodes); number the classes 0..C-1 (np.unique(y, return_inverse=True)) "
                        "and re-ingest")
    if "train_mask" in info.attrs and scan.train == 0:
        problems.append(f"{who}, array train_mask: no node is in train_mask (in any of the {ds.num_parts} "
                        "partitions), so --task node has nothing to train on: re-ingest with training nodes")
    return problems


def _scan(ds: Dataset, info: NodeTypeInfo, parts: Iterable[int]) -> _Scan:
    masks = [m for m in SPLIT_MASKS if m in info.attrs and np.dtype(info.attrs[m].dtype) == np.bool_]
    negative, largest, train = None, None, 0
    for part in parts:
        path = layout.node_array(part, info.key, "y")
        y = ds.array(path)
        held = {m: ds.array(layout.node_array(part, info.key, m)) for m in masks}
        for start in range(0, len(y), _BLOCK):
            block = np.asarray(y[start:start + _BLOCK])
            if not block.size:
                continue
            flat = block.reshape(len(block), -1)
            found = {m: np.asarray(rows[start:start + len(flat)], dtype=bool) for m, rows in held.items()}
            train += int(np.count_nonzero(found["train_mask"])) if "train_mask" in found else 0
            top = int(np.argmax(flat.max(axis=1)))
            if largest is None or int(flat[top].max()) > largest[2]:
                largest = (path, start + top, int(flat[top].max()))
            if negative is None and found:
                bad = np.flatnonzero(np.logical_or.reduce(list(found.values())) & (flat < 0).any(axis=1))
                if len(bad):
                    row = int(bad[0])
                    mask = next(m for m in masks if found[m][row])
                    negative = (path, start + row, mask, int(flat[row][flat[row] < 0][0]))
    return _Scan(negative, largest, train)


def topology_problems(ds: Dataset, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """The CSC invariants the samplers rely on, per partition and edge type (one line each, at the first bad
    row): pointers that start at 0, never decrease and end at the edge count, source IDs in range and sorted,
    edge IDs in range. Partitions with an array in ``skip`` (missing or failing its checksum) are left out."""
    problems = []
    sources = {t.key: t for t in ds.manifest.node_types}
    for info in ds.manifest.edge_types:
        for part in range(ds.num_parts):
            paths = {name: layout.edge_array(part, info.key, name) for name in layout.TOPOLOGY}
            paths = {name: path for name, path in paths.items() if path in ds.manifest.arrays}
            if set(paths.values()) & skip or not {layout.INDPTR, layout.INDICES, layout.EID} <= set(paths):
                continue
            arrays = {name: np.asarray(ds.array(path)) for name, path in paths.items()}
            where = layout.edge_array(part, info.key, "").rstrip("/")
            found = csc_problem(where, arrays[layout.INDPTR], arrays[layout.INDICES], arrays[layout.EID],
                                arrays.get(layout.PACKED), sources[info.src].num_nodes, info.num_edges,
                                {n: ds.manifest.arrays[p].chunk_rows for n, p in paths.items()})
            problems += [found] if found else []
    return problems


def trainable_problems(ds: Dataset, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Everything the training door checks, for every node type (``graphstore verify``): feature widths,
    labels of labelled types, and the topology. Arrays in ``skip`` (already reported damaged) are not read."""
    problems = []
    for info in ds.manifest.node_types:
        found = feature_problem(info)
        problems += [found] if found else []
        arrays = {layout.node_array(p, info.key, a) for p in range(ds.num_parts) for a in ("y", *SPLIT_MASKS)}
        if is_labelled(info) and not arrays & skip:
            problems += label_problems(ds, info)
    return problems + topology_problems(ds, skip)
