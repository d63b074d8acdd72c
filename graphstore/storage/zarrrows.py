"""Compressed arrays read through zarr: from a store, or from chunk bytes already fetched."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.dataset.manifest import ArrayInfo


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
