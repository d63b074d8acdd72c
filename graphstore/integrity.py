"""Trust stored data only as far as it was checked: chunk checksums, chunk files, CSC invariants."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from graphstore import layout
from graphstore.errors import CorruptDatasetError
from graphstore.manifest import ArrayInfo

if TYPE_CHECKING:
    from graphstore.storage import Location

_OK, _START, _DECREASING, _PAST_END, _END, _RANGE, _ORDER = range(7)
_WHAT = {
    _START: "indptr[0] is not 0",
    _DECREASING: "indptr decreases",
    _PAST_END: "indptr points past the end of indices",
    _END: "indptr does not end at the edge count",
    _RANGE: "a source ID is outside the source node range",
    _ORDER: "source IDs of one destination are not sorted",
}


def verify_chunks(location: Location, path: str, info: ArrayInfo) -> None:
    """Recompute the crc32 of every stored chunk of ``path``; raise naming the first bad one."""
    for index, expected in enumerate(info.checksums):
        key = layout.chunk_key(path, index, len(info.shape))
        found = location.checksum(key)
        if found is None:
            raise CorruptDatasetError(f"{location.url}: chunk {index} of {path} is missing ({key}); run "
                                      f"`graphstore verify {location.url}` and re-ingest the dataset")
        if found != expected:
            raise CorruptDatasetError(
                f"{location.url}: chunk {index} of {path} ({key}) fails its checksum ({found}, manifest says "
                f"{expected}): the data was damaged after ingest; run `graphstore verify {location.url}` and "
                "re-ingest the dataset"
            )


def chunk_file_problems(location: Location, arrays: dict[str, ArrayInfo]) -> list[str]:
    """Chunk files that are missing or shorter than a chunk (local datasets; ``os.stat`` only, no reads)."""
    problems = []
    for path, info in sorted(arrays.items()):
        row_bytes = np.dtype(info.dtype).itemsize * int(np.prod(info.shape[1:], dtype=np.int64))
        for index in range(info.num_chunks):
            key = layout.chunk_key(path, index, len(info.shape))
            file = location.local_file(key)
            if file is None:
                problems.append(f"chunk {index} of {path} is missing ({key})")
            elif info.compression == "none" and os.path.getsize(file) < info.chunk_rows * row_bytes:
                problems.append(f"chunk {index} of {path} ({key}) is truncated ({os.path.getsize(file)} bytes, "
                                f"expected {info.chunk_rows * row_bytes})")
    return problems


def check_csc(where: str, indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray, packed: np.ndarray | None,
              num_src: int, num_edges: int, chunk_rows: dict[str, int]) -> None:
    """Raise :class:`CorruptDatasetError` unless the CSC arrays of one partition and edge type are sound.

    ``indptr`` starts at 0, never decreases and ends at ``len(indices)``; ``indices`` lie in
    ``[0, num_src)`` and are sorted per destination; ``eid`` in ``[0, num_edges)``; ``packed`` (if any)
    repeats ``indices`` and ``eid``. One pass per array (numba), no temporaries: samplers may then
    index with these values without bounds checks.
    """
    code, pos = _csc_kernel(indptr, indices, num_src)
    if code != _OK:
        name = layout.INDICES if code in (_RANGE, _ORDER) else layout.INDPTR
        raise _corrupt(where, name, pos, chunk_rows, _WHAT[code])
    pos = _range_kernel(eid, num_edges)
    if pos >= 0:
        raise _corrupt(where, layout.EID, pos, chunk_rows, f"an edge ID is outside [0, {num_edges})")
    if packed is not None:
        pos = _packed_kernel(packed.reshape(-1), indices, eid)
        if pos >= 0:
            raise _corrupt(where, layout.PACKED, pos, chunk_rows, "it differs from indices/eid")


def _corrupt(where: str, name: str, pos: int, chunk_rows: dict[str, int], what: str) -> CorruptDatasetError:
    chunk = pos // max(1, chunk_rows.get(name, 1))
    return CorruptDatasetError(
        f"{where}/{name}: chunk {chunk} is damaged ({what}, at row {pos}); run `graphstore verify` and "
        "re-ingest the dataset"
    )


@njit(cache=True, nogil=True)
def _csc_kernel(indptr: np.ndarray, indices: np.ndarray, num_src: int) -> tuple[int, int]:  # pragma: no cover
    m = len(indices)
    if len(indptr) == 0 or indptr[0] != 0:
        return _START, 0
    for d in range(1, len(indptr)):  # the pointers first: the loop below trusts them
        if indptr[d] < indptr[d - 1]:
            return _DECREASING, d
        if indptr[d] > m:
            return _PAST_END, d
    if indptr[len(indptr) - 1] != m:
        return _END, len(indptr) - 1
    for d in range(len(indptr) - 1):
        start, stop = indptr[d], indptr[d + 1]
        for j in range(start, stop):
            v = indices[j]
            if v < 0 or v >= num_src:
                return _RANGE, j
            if j > start and v < indices[j - 1]:
                return _ORDER, j
    return _OK, 0


@njit(cache=True, nogil=True)
def _range_kernel(values: np.ndarray, bound: int) -> int:  # pragma: no cover
    for i in range(len(values)):
        if values[i] < 0 or values[i] >= bound:
            return i
    return -1


@njit(cache=True, nogil=True)
def _packed_kernel(flat: np.ndarray, indices: np.ndarray, eid: np.ndarray) -> int:  # pragma: no cover
    if len(flat) != 2 * len(indices):
        return 0
    for i in range(len(indices)):
        if flat[2 * i] != indices[i] or flat[2 * i + 1] != eid[i]:
            return i
    return -1
