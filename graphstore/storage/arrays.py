"""Open one stored array for reading: memory-mapped in place, through the chunk cache, or through zarr."""

from __future__ import annotations

import numpy as np

from graphstore.dataset import layout
from graphstore.storage.cache import ChunkCache
from graphstore.errors import CorruptDatasetError
from graphstore.storage.lazy import LazyRows
from graphstore.dataset.manifest import ArrayInfo
from graphstore.storage.mapped import map_chunks
from graphstore.storage.local import Location
from graphstore.storage.zarrrows import ZarrRows, zarr_rows_from_chunks

__all__ = ["LazyRows", "ZarrRows", "open_array", "zarr_rows_from_chunks"]


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
    paths = []
    for i in range(info.num_chunks):
        file = location.local_file(layout.chunk_key(path, i, len(info.shape)))
        if file is None:
            raise CorruptDatasetError(
                f"{location.url}: chunk {i} of {path} is missing; run `graphstore verify {location.url}` "
                "and re-ingest the dataset"
            )
        paths.append(file)
    # topology is read at random and stays resident: huge pages. Not edge attributes: an edge feature matrix
    # may exceed memory, and a miss would read 2 MiB (the sampler advises the times it reads: topology.prefault)
    huge = "/edges/" in f"/{path}" and path.rsplit("/", 1)[-1] in layout.TOPOLOGY
    return map_chunks(paths, info.shape, np.dtype(info.dtype), info.chunk_rows, f"{location.url}/{path}", huge)
