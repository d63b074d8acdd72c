"""Open one stored array for reading: memory-mapped when uncompressed and local, else through zarr."""

from __future__ import annotations

import numpy as np

from graphstore import layout
from graphstore.errors import CorruptDatasetError
from graphstore.manifest import ArrayInfo
from graphstore.mapped import map_chunks
from graphstore.storage import LocalLocation


class ZarrRows:
    """Row access to a compressed array through zarr (the slow path; compressed is for cold storage)."""

    def __init__(self, location: LocalLocation, path: str, info: ArrayInfo) -> None:
        import zarr

        self._array = zarr.open_array(location.zarr_store(read_only=True), path=path, mode="r")
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


def open_array(location: LocalLocation, path: str, info: ArrayInfo) -> np.ndarray | ZarrRows:
    """The array at ``path``: an ``np.ndarray`` over mapped chunk files, or a :class:`ZarrRows`."""
    expected = -(-info.shape[0] // info.chunk_rows) if info.shape[0] else 0
    if info.num_chunks != expected:
        raise CorruptDatasetError(f"{location.url}: manifest lists {info.num_chunks} chunks for {path}, "
                                  f"its shape needs {expected}; re-ingest the dataset")
    if info.compression != "none" or not location.is_local:
        return ZarrRows(location, path, info)
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
