"""Open one stored array for reading: memory-mapped in place, through the chunk cache, or through zarr."""

from __future__ import annotations

import numpy as np

from graphstore.dataset import layout
from graphstore.storage.cache import ChunkCache
from graphstore.errors import CorruptDatasetError, InvalidInputError
from graphstore.storage.fileio import ChunkFiles
from graphstore.storage.lazy import LazyRows
from graphstore.dataset.manifest import ArrayInfo
from graphstore.storage.mapped import map_chunks
from graphstore.storage.local import Location
from graphstore.storage.zarrrows import ZarrRows, zarr_rows_from_chunks

__all__ = ["LazyRows", "ZarrRows", "open_array", "open_chunk_files", "zarr_rows_from_chunks"]


def open_array(location: Location, path: str, info: ArrayInfo,
               cache: ChunkCache | None = None) -> np.ndarray | ZarrRows | LazyRows:
    """The array at ``path``: an ``np.ndarray`` over mapped local chunk files, a :class:`ZarrRows`
    (compressed, local), or a :class:`~graphstore.storage.lazy.LazyRows` reading a remote array through ``cache``."""
    expected = -(-info.shape[0] // info.chunk_rows) if info.shape[0] else 0
    if info.num_chunks != expected:
        raise CorruptDatasetError(f"{location.url}: manifest lists {info.num_chunks} chunks for {path}, "
                                  f"its shape needs {expected}; re-ingest the dataset")
    if not location.is_local:
        if cache is None:
            raise TypeError(f"{location.url}/{path}: reading a remote array needs its dataset's chunk cache")
        return LazyRows(cache, path, info)
    if info.compression != "none":
        return ZarrRows(location.zarr_store(read_only=True), path, info)
    paths = _chunk_paths(location, path, info)
    # topology is read at random and stays resident: huge pages. Not edge attributes: an edge feature matrix
    # may exceed memory, and a miss would read 2 MiB (the sampler advises the times it reads: topology.prefault)
    huge = "/edges/" in f"/{path}" and path.rsplit("/", 1)[-1] in layout.TOPOLOGY
    return map_chunks(paths, info.shape, np.dtype(info.dtype), info.chunk_rows, f"{location.url}/{path}", huge)


def open_chunk_files(location: Location, path: str, info: ArrayInfo) -> ChunkFiles:
    """The chunk files of the array at ``path`` open for ``pread`` (:mod:`graphstore.storage.fileio`): a local,
    uncompressed array's; anything else raises, naming what would serve it."""
    if not location.is_local or info.compression != "none":
        what = "remote" if not location.is_local else f"compressed ({info.compression})"
        raise InvalidInputError(f"{location.url}/{path}: the array is {what}; reading without mapping needs a "
                                  "local, uncompressed dataset: copy it to local disk, or leave the dataset mapped")
    paths = _chunk_paths(location, path, info)
    return ChunkFiles(paths, info.shape, np.dtype(info.dtype), info.chunk_rows, f"{location.url}/{path}")


def _chunk_paths(location: Location, path: str, info: ArrayInfo) -> list[str]:
    paths = []
    for i in range(info.num_chunks):
        file = location.local_file(layout.chunk_key(path, i, len(info.shape)))
        if file is None:
            raise CorruptDatasetError(
                f"{location.url}: chunk {i} of {path} is missing; run `graphstore verify {location.url}` "
                "and re-ingest the dataset"
            )
        paths.append(file)
    return paths
