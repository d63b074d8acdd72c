"""Gather rows by global ID from every partition's memory-mapped array in one pass (numba).

A batch asks for rows spread over all partitions. Splitting the IDs by owner, reading each part and
putting the pieces back in order costs several passes and copies; this kernel finds each ID's
partition (a branch-free count over the partition starts) and copies its row straight into the
output, in machine words, writing the output in order (measured faster than grouping the reads by
partition, which scatters the writes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_PARTS = 64  # one compiled kernel per partition count: beyond this, the per-owner path is used


def word_views(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...] | None:
    """Each array as a 2-D ``[rows, words]`` view in the widest word dividing a row, or ``None`` when
    an array is not contiguous (then the caller gathers another way)."""
    if not arrays or any(not a.flags.c_contiguous for a in arrays):
        return None
    row_bytes = arrays[0].dtype.itemsize * int(np.prod(arrays[0].shape[1:], dtype=np.int64))
    word = next(w for w in (np.uint64, np.uint32, np.uint16, np.uint8) if row_bytes % np.dtype(w).itemsize == 0)
    return tuple(a.reshape(len(a), -1).view(word) if len(a) else np.zeros((0, row_bytes // np.dtype(word).itemsize),
                                                                          word) for a in arrays)


def gather(views: tuple[np.ndarray, ...], offsets: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """Rows ``ids`` (global IDs, already checked to be in range, at least one) of the array split as
    ``views`` (partition ``p`` holds IDs ``[offsets[p], offsets[p+1])``), written into ``out``: a
    C-contiguous ``(len(ids), *row_shape)`` array of the rows' dtype (ordinary or pinned memory)."""
    _gather(views, np.asarray(offsets, np.int64), ids, out.reshape(len(ids), -1).view(views[0].dtype))


@njit(cache=True, nogil=True)
def _gather(views, offsets, ids, out):
    width = out.shape[1]
    for i in range(len(ids)):  # in output order: writes stream, reads are whole rows
        p = 0
        for j in range(1, len(offsets) - 1):
            p += ids[i] >= offsets[j]
        src = views[p]
        r = ids[i] - offsets[p]
        for w in range(width):
            out[i, w] = src[r, w]
