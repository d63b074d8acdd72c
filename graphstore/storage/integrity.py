"""Trust stored data only as far as it was checked: manifest, Zarr metadata, chunk checksums and files, CSC."""

from __future__ import annotations

import json
import mmap
import os
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from graphstore.dataset import layout
from graphstore.errors import CorruptDatasetError
from graphstore.dataset.manifest import ArrayInfo, AttrSchema, Manifest

if TYPE_CHECKING:
    from graphstore.storage.local import Location

Read = Callable[[str], "bytes | None"]  # the stored bytes of a key, None when absent
_INT64 = AttrSchema("int64")

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
    """Recompute the crc32 of every stored chunk of ``path``; raise naming the first bad one.

    A local chunk is read through a mapping advised for huge pages (:func:`mapped_checksum`): this is
    the first read of a partition's topology, and what it leaves in the page cache decides whether the
    sampler's mappings of it can use 2 MiB pages."""
    for index, expected in enumerate(info.checksums):
        key = layout.chunk_key(path, index, len(info.shape))
        file = location.local_file(key) if location.is_local else None
        found = mapped_checksum(file) if file is not None else location.checksum(key)
        if found is None:
            raise CorruptDatasetError(f"{location.url}: chunk {index} of {path} is missing ({key}); run "
                                      f"`graphstore verify {location.url}` and re-ingest the dataset")
        if found != expected:
            raise CorruptDatasetError(
                f"{location.url}: chunk {index} of {path} ({key}) fails its checksum ({found}, manifest says "
                f"{expected}): the data was damaged after ingest; run `graphstore verify {location.url}` and "
                "re-ingest the dataset"
            )


def mapped_checksum(file: str) -> str:
    """``crc32:<hex>`` of a local file, read through a mapping advised for huge pages (``MADV_HUGEPAGE``,
    where the platform has it), so that a cold page cache fills with 2 MiB folios, as a sampler reading the
    file at random wants them (:func:`graphstore.storage.mapped.advise_huge_pages`)."""
    with open(file, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return f"crc32:{zlib.crc32(b''):08x}"
        with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as view:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                view.madvise(mmap.MADV_HUGEPAGE)
            return f"crc32:{zlib.crc32(view):08x}"


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


def metadata_key(path: str) -> str:
    """The Zarr v3 metadata document of the group or array at ``path``."""
    return f"{path}/{layout.ROOT_METADATA}"


def metadata_paths(manifest: Manifest) -> list[str]:
    """Every group and array whose metadata a sound dataset stores: each partition, the groups on the way to
    each array of the manifest, and the arrays. Groups come before what they hold."""
    paths = {layout.part_key(p) for p in range(manifest.num_parts)}
    for path in manifest.arrays:
        parts = path.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(paths)


def storage_problems(manifest: Manifest, read: Read, has: Callable[[str], bool]) -> tuple[list[str], set[str]]:
    """What is wrong with the stored Zarr metadata against the manifest (no chunk is read): one line per
    missing partition, missing array, and group or array metadata that is missing, does not parse or
    disagrees with the manifest (shape, dtype, chunking, codec). Also returns the arrays that are gone
    (no metadata and nothing stored under them): their chunks need no further look."""
    problems: list[str] = []
    gone: set[str] = set()
    for path in metadata_paths(manifest):
        if any(path.startswith(f"{g}/") for g in gone) or path in gone:
            gone.add(path)
            continue
        raw = read(metadata_key(path))
        info = manifest.arrays.get(path)
        if raw is None and not has(path):
            gone.add(path)
            problems.append(_missing(manifest, path))
        elif info is not None:
            problem = array_metadata_problem(path, info, raw)
            problems += [problem] if problem else []
        elif raw is None or _parse(raw, "group") is None:
            state = "missing" if raw is None else "not Zarr v3 group metadata"
            problems.append(f"{path}: its group metadata {metadata_key(path)} is {state}")
    return problems, {p for p in gone if p in manifest.arrays}


def _missing(manifest: Manifest, path: str) -> str:
    if path in manifest.arrays:
        return f"{path}: the array is missing (nothing is stored under {path}/)"
    inside = sum(p.startswith(f"{path}/") for p in manifest.arrays)
    what = "the partition" if "/" not in path else "the group"
    return f"{path}: {what} is missing (nothing is stored under {path}/; the manifest lists {inside} arrays in it)"


def _parse(raw: bytes, node_type: str) -> dict[str, Any] | None:
    """A Zarr v3 metadata document of ``node_type``, or None if ``raw`` is not one."""
    try:
        doc = json.loads(raw)
    except ValueError:  # also bad UTF-8
        return None
    ok = isinstance(doc, dict) and doc.get("zarr_format") == 3 and doc.get("node_type") == node_type
    return doc if ok else None


def array_metadata_problem(path: str, info: ArrayInfo, raw: bytes | None) -> str | None:
    """What is wrong with the stored Zarr metadata of one array against its manifest entry, or None."""
    key = metadata_key(path)
    if raw is None:
        return f"{path}: its metadata {key} is missing"
    doc = _parse(raw, "array")
    if doc is None:
        return f"{path}: its metadata {key} does not parse as Zarr v3 array metadata ({len(raw)} bytes)"
    try:
        found = _layout_of(doc)
    except (AttributeError, KeyError, TypeError, ValueError):
        return f"{path}: its metadata {key} lacks shape, data_type, chunk_grid or codecs"
    wanted = {"shape": list(info.shape), "dtype": np.dtype(info.dtype).name,
              "chunks": [info.chunk_rows, *info.shape[1:]], "zstd": info.compression == "zstd"}
    wrong = [f"{name} {found[name]} (the manifest says {wanted[name]})" for name in wanted
             if found[name] != wanted[name]]
    return f"{path}: its metadata {key} has {', '.join(wrong)}" if wrong else None


def _layout_of(doc: dict[str, Any]) -> dict[str, Any]:
    return {"shape": [int(n) for n in doc["shape"]], "dtype": str(doc["data_type"]),
            "chunks": [int(n) for n in doc["chunk_grid"]["configuration"]["chunk_shape"]],
            "zstd": any(codec["name"] == "zstd" for codec in doc["codecs"])}


def manifest_problems(manifest: Manifest) -> list[str]:
    """Where the manifest contradicts itself (no I/O): partition books and edge counts, and every array its
    node and edge types imply present in its arrays table with their rows, dtype and chunk count."""
    problems = []
    for info in manifest.node_types:
        offsets = list(info.offsets)
        if len(offsets) != manifest.num_parts + 1 or offsets[0] != 0 or offsets[-1] != info.num_nodes or \
                any(b < a for a, b in zip(offsets, offsets[1:])):
            problems.append(f"node type {info.key}: offsets {offsets} are not a partition book of {info.num_nodes} "
                            f"nodes in {manifest.num_parts} partitions")
    keys = {t.key for t in manifest.node_types}
    for info in manifest.edge_types:
        if not {info.src, info.dst} <= keys:
            problems.append(f"edge type {info.key}: its node types {info.src!r}, {info.dst!r} are not all in "
                            f"the manifest's node types {sorted(keys)}")
        elif len(info.edges_per_part) != manifest.num_parts or sum(info.edges_per_part) != info.num_edges:
            problems.append(f"edge type {info.key}: edges_per_part {list(info.edges_per_part)} do not add up to "
                            f"{info.num_edges} edges in {manifest.num_parts} partitions")
    if problems:
        return problems
    for path, (rows, schema) in sorted(_implied_arrays(manifest).items()):
        problems += _entry_problems(manifest.arrays.get(path), path, rows, schema)
    for path, entry in sorted(manifest.arrays.items()):
        needed = -(-entry.shape[0] // entry.chunk_rows) if entry.shape and entry.chunk_rows > 0 else -1
        if needed != entry.num_chunks:
            problems.append(f"{path}: the manifest lists {entry.num_chunks} chunks, its shape needs {needed}")
    return problems


def _implied_arrays(manifest: Manifest) -> dict[str, tuple[int, AttrSchema]]:
    """Array path -> (rows, schema) of every node and edge array the types of ``manifest`` imply."""
    out = {}
    ntypes = {t.key: t for t in manifest.node_types}
    for p in range(manifest.num_parts):
        for t in manifest.node_types:
            for name, schema in {layout.ORIG_ID: _INT64, **t.attrs}.items():
                out[layout.node_array(p, t.key, name)] = (t.offsets[p + 1] - t.offsets[p], schema)
        for e in manifest.edge_types:
            dst = ntypes[e.dst]
            out[layout.edge_array(p, e.key, layout.INDPTR)] = (dst.offsets[p + 1] - dst.offsets[p] + 1, _INT64)
            for name, schema in {layout.INDICES: _INT64, layout.EID: _INT64, **e.attrs}.items():
                out[layout.edge_array(p, e.key, name)] = (e.edges_per_part[p], schema)
    return out


def _entry_problems(entry: ArrayInfo | None, path: str, rows: int, schema: AttrSchema) -> list[str]:
    if entry is None:
        return [f"{path}: the manifest's arrays table has no entry for it"]
    wanted = (rows, *schema.shape)
    if tuple(entry.shape) != wanted or np.dtype(entry.dtype) != np.dtype(schema.dtype):
        return [f"{path}: the manifest's arrays table says {np.dtype(entry.dtype).name}{list(entry.shape)}, its "
                f"node/edge type implies {np.dtype(schema.dtype).name}{list(wanted)}"]
    return []


def check_csc(where: str, indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray, packed: np.ndarray | None,
              num_src: int, num_edges: int, chunk_rows: dict[str, int]) -> None:
    """Raise :class:`CorruptDatasetError` unless the CSC arrays of one partition and edge type are sound.

    ``indptr`` starts at 0, never decreases and ends at ``len(indices)``; ``indices`` lie in
    ``[0, num_src)`` and are sorted per destination; ``eid`` in ``[0, num_edges)``; ``packed`` (if any)
    repeats ``indices`` and ``eid``. One pass per array (numba), no temporaries: samplers may then
    index with these values without bounds checks.
    """
    problem = csc_problem(where, indptr, indices, eid, packed, num_src, num_edges, chunk_rows)
    if problem is not None:
        raise CorruptDatasetError(f"{problem}; run `graphstore verify` and re-ingest the dataset")


def csc_problem(where: str, indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray, packed: np.ndarray | None,
                num_src: int, num_edges: int, chunk_rows: dict[str, int]) -> str | None:
    """What :func:`check_csc` would refuse, as one line naming the array, chunk and row (``None``: sound)."""
    code, pos = _csc_kernel(indptr, indices, num_src)
    if code != _OK:
        name = layout.INDICES if code in (_RANGE, _ORDER) else layout.INDPTR
        return _damage(where, name, pos, chunk_rows, _WHAT[code])
    pos = _range_kernel(eid, num_edges)
    if pos >= 0:
        return _damage(where, layout.EID, pos, chunk_rows, f"an edge ID is outside [0, {num_edges})")
    if packed is not None:
        pos = _packed_kernel(packed.reshape(-1), indices, eid)
        if pos >= 0:
            return _damage(where, layout.PACKED, pos, chunk_rows, "it differs from indices/eid")
    return None


def _damage(where: str, name: str, pos: int, chunk_rows: dict[str, int], what: str) -> str:
    chunk = pos // max(1, chunk_rows.get(name, 1))
    return f"{where}/{name}: chunk {chunk} is damaged ({what}, at row {pos})"


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
