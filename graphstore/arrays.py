"""Open one stored array for reading: memory-mapped in place, through the chunk cache, or through zarr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphstore import layout
from graphstore.errors import CorruptDatasetError
from graphstore.manifest import ArrayInfo
from graphstore.mapped import map_chunks
from graphstore.storage import Location

if TYPE_CHECKING:
    from graphstore.cache import ChunkCache
    from graphstore.lazy import LazyRows


class ZarrRows:
    """Row access to a compressed array through zarr (the slow path; compressed is for cold storage)."""

    def __init__(self, store: Any, path: str, info: ArrayInfo) -> None:
        import zarr

        self._array = zarr.open_array(store, path=path, mode="r")
        self.shape, self.dtype = info.shape, np.dtype(info.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: object) -> np.ndarray:
        if isinstance(key, np.ndarray) and key.dtype.kind in "iu":
            if len(key) == 0:
                return np.zeros((0, *self.shape[1:]), self.dtype)
            uniq, inverse = np.unique(key, return_inverse=True)  # zarr wants sorted, unique selections
            return np.asarray(self._array.get_orthogonal_selection(uniq))[inverse]
        return np.asarray(self._array[key])

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        out = np.asarray(self._array[...])
        return out if dtype is None else out.astype(dtype)


def zarr_rows_from_chunks(path: str, info: ArrayInfo, chunks: dict[int, bytes]) -> ZarrRows:
    """A compressed array from its stored chunk bytes, decoded by zarr in memory (metadata from the manifest)."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype

    stored: dict[str, Any] = {}
    store = zarr.storage.MemoryStore(store_dict=stored)
    zarr.create_array(store, name=path, shape=info.shape, chunks=(info.chunk_rows, *info.shape[1:]),
                      dtype=info.dtype, compressors=zarr.codecs.ZstdCodec(), fill_value=0)
    prototype = default_buffer_prototype()
    for index, blob in chunks.items():
        stored[layout.chunk_key(path, index, len(info.shape))] = prototype.buffer.from_bytes(blob)
    return ZarrRows(store, path, info)


def open_array(location: Location, path: str, info: ArrayInfo,
               cache: ChunkCache | None = None) -> np.ndarray | ZarrRows | LazyRows:
    """The array at ``path``: an ``np.ndarray`` over mapped local chunk files, a :class:`ZarrRows`
    (compressed, local), or a :class:`~graphstore.lazy.LazyRows` reading a remote array through ``cache``."""
    expected = -(-info.shape[0] // info.chunk_rows) if info.shape[0] else 0
    if info.num_chunks != expected:
        raise CorruptDatasetError(f"{location.url}: manifest lists {info.num_chunks} chunks for {path}, "
                                  f"its shape needs {expected}; re-ingest the dataset")
    if not location.is_local:
        from graphstore.lazy import LazyRows

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
    return map_chunks(paths, info.shape, np.dtype(info.dtype), info.chunk_rows, f"{location.url}/{path}")
