"""Relabel nodes so that partition p owns one contiguous range of global IDs per node type."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Relabel:
    """The range partition book of one node type and the maps between input and global IDs."""

    order: np.ndarray  # global ID -> input ID (increasing within a partition); int32 below 2**31 nodes
    new_of_orig: np.ndarray  # input ID -> global ID (the same dtype)
    offsets: np.ndarray  # partition p owns global IDs [offsets[p], offsets[p + 1])

    @property
    def num_nodes(self) -> int:
        return len(self.order)

    def owner(self, global_ids: np.ndarray) -> np.ndarray:
        """The partition owning each global ID (a searchsorted over ``num_parts + 1`` offsets)."""
        return np.searchsorted(self.offsets, global_ids, side="right") - 1


def relabel(assign: np.ndarray, num_parts: int) -> Relabel:
    """Build the relabelling from a node→partition assignment; keeps input order inside a partition.

    Examples
    --------
    >>> r = relabel(np.array([1, 0, 1, 0]), 2)
    >>> r.order.tolist(), r.new_of_orig.tolist(), r.offsets.tolist()
    ([1, 3, 0, 2], [2, 0, 3, 1], [0, 2, 4])
    """
    order = np.argsort(assign, kind="stable").astype(np.int32 if len(assign) < 2**31 else np.int64)
    new_of_orig = np.empty_like(order)
    new_of_orig[order] = np.arange(len(order), dtype=np.int64)
    offsets = np.zeros(num_parts + 1, np.int64)
    np.cumsum(np.bincount(assign, minlength=num_parts)[:num_parts], out=offsets[1:])
    return Relabel(order, new_of_orig, offsets)
