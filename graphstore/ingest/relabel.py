"""Relabel nodes so that partition p owns one contiguous range of global IDs per node type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.ingest.scratch import Scratch, StoredArray


@dataclass(frozen=True)
class Relabel:
    """The range partition book of one node type and the maps between input and global IDs.

    ``order`` and ``new_of_orig`` are arrays, or :class:`StoredArray` handles (:meth:`stored`) that tasks
    read from the scratch folder: a task maps the pages it reads, and no per-node map travels
    through the Dask scheduler or stays in the client.
    """

    order: np.ndarray | StoredArray  # global ID -> input ID (increasing within a partition); int32 below 2**31 nodes
    new_of_orig: np.ndarray | StoredArray  # input ID -> global ID (the same dtype)
    offsets: np.ndarray  # partition p owns global IDs [offsets[p], offsets[p + 1])

    @property
    def num_nodes(self) -> int:
        return len(self.order)

    def owner(self, global_ids: Any) -> np.ndarray:
        """The partition owning each global ID (a searchsorted over ``num_parts + 1`` offsets)."""
        return np.searchsorted(self.offsets, global_ids, side="right") - 1

    def stored(self, scratch: Scratch, name: str) -> Relabel:
        """This book with its two maps written to ``scratch`` (``books/<name>.*``): handles instead of arrays."""
        return Relabel(scratch.put_array(f"books/{name}.order.npy", np.asarray(self.order)),
                       scratch.put_array(f"books/{name}.new_of_orig.npy", np.asarray(self.new_of_orig)), self.offsets)


def relabel(assign: np.ndarray, num_parts: int) -> Relabel:
    """Build the relabelling from a node→partition assignment; keeps input order inside a partition.

    Examples
    --------
    >>> r = relabel(np.array([1, 0, 1, 0]), 2)
    >>> r.order.tolist(), r.new_of_orig.tolist(), r.offsets.tolist()
    ([1, 3, 0, 2], [2, 0, 3, 1], [0, 2, 4])
    """
    dtype = np.int32 if len(assign) < 2**31 else np.int64
    order = np.argsort(assign, kind="stable").astype(dtype)
    new_of_orig = np.empty_like(order)
    new_of_orig[order] = np.arange(len(order), dtype=dtype)
    offsets = np.zeros(num_parts + 1, np.int64)
    np.cumsum(np.bincount(assign, minlength=num_parts)[:num_parts], out=offsets[1:])
    return Relabel(order, new_of_orig, offsets)
