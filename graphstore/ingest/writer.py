"""Write row-chunked Zarr v3 arrays chunk by chunk (bounded memory) and checksum every stored chunk."""

from __future__ import annotations

import logging
import math
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from zarr.storage import WrapperStore

from graphstore import layout
from graphstore.errors import GraphstoreError, InvalidInputError
from graphstore.manifest import ArrayInfo
from graphstore.storage import Location

logger = logging.getLogger(__name__)

COMPRESSIONS = ("none", "zstd")
_PAGE = 4096

Fill = Callable[[int, int], np.ndarray]  # rows [start, stop) of the array being written


def chunk_rows_for(num_rows: int, row_shape: tuple[int, ...], dtype: np.dtype, chunk_bytes: int) -> int:
    """Rows per chunk: about ``chunk_bytes``, a whole number of pages (so chunks map back to back)."""
    row_bytes = max(1, np.dtype(dtype).itemsize * math.prod(row_shape))
    unit = _PAGE // math.gcd(row_bytes, _PAGE)
    rows = max(unit, (chunk_bytes // row_bytes) // unit * unit)
    return max(1, num_rows) if num_rows <= rows else rows


class ChecksumStore(WrapperStore):  # type: ignore[type-arg]
    """A zarr store wrapper recording the crc32 of every value written: checksums of exactly the stored
    bytes (any codec), without reading a chunk back from disk or object storage."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.checksums: dict[str, str] = {}

    def _with_store(self, store: Any) -> ChecksumStore:
        out = type(self)(store)
        out.checksums = self.checksums
        return out

    async def set(self, key: str, value: Any) -> None:
        self.checksums[key] = f"crc32:{zlib.crc32(value.as_numpy_array()):08x}"
        await self._store.set(key, value)


class ArrayWriter:
    """Creates the arrays of one dataset under ``location`` and fills them chunk by chunk.

    Examples
    --------
    >>> w = ArrayWriter(LocalLocation("/tmp/ds"), compression="none", chunk_bytes=1 << 20)  # doctest: +SKIP
    >>> info = w.write("a", (10,), np.int64, lambda start, stop: np.arange(start, stop))  # doctest: +SKIP
    """

    def __init__(self, location: Location, compression: str = "none", chunk_bytes: int = 32 << 20,
                 create_root: bool = True) -> None:
        if compression not in COMPRESSIONS:
            raise InvalidInputError(f"compression {compression!r} is not one of {COMPRESSIONS}")
        if chunk_bytes < _PAGE:
            raise InvalidInputError(f"chunk size {chunk_bytes} bytes is below one page ({_PAGE}); use at least 1 MB")
        self.location = location
        self.compression = compression
        self.chunk_bytes = chunk_bytes
        self.bytes_written = 0
        self.read_back = 0  # chunks whose checksum had to be read back from storage (normally none)
        self._store = ChecksumStore(location.zarr_store(read_only=False))
        if create_root:  # False on an engine's worker: the client created it, and recreating would clear it
            self._guard("creating the root group", lambda: zarr.create_group(self._store, overwrite=True))

    def _guard(self, action: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, with storage failures turned into the location's graphstore errors (naming the URL)."""
        try:
            return fn()
        except GraphstoreError:
            raise
        except Exception as exc:
            error = self.location.storage_error(exc, action)
            if error is exc:
                raise
            raise error from exc

    def write(self, path: str, shape: tuple[int, ...], dtype: Any, fill: Fill,
              check: Callable[[np.ndarray, int], None] | None = None) -> ArrayInfo:
        """Create array ``path`` and write it from ``fill(start, stop)`` one chunk at a time.

        ``check(block, start)`` may raise to refuse the data; nothing is committed then.
        """
        dtype = np.dtype(dtype)
        rows = chunk_rows_for(shape[0], tuple(shape[1:]), dtype, self.chunk_bytes)
        array = self._guard(f"creating {path}", lambda: zarr.create_array(
            self._store, name=path, shape=shape, chunks=(rows, *shape[1:]), dtype=dtype,
            compressors=None if self.compression == "none" else zarr.codecs.ZstdCodec(level=3),
            fill_value=0, config={"write_empty_chunks": True},
        ))
        checksums = []
        for index, start in enumerate(range(0, shape[0], rows)):
            stop = min(start + rows, shape[0])
            block = np.ascontiguousarray(fill(start, stop), dtype=dtype)
            if block.shape != (stop - start, *shape[1:]):
                raise InvalidInputError(f"{path}: rows {start}:{stop} came back with shape {block.shape}")
            if check is not None:
                check(block, start)
            key = layout.chunk_key(path, index, len(shape))
            self._guard(f"writing {key}", lambda: self._set(array, start, stop, block))
            checksums.append(self._store.checksums.pop(key, None) or self._read_back(key))
            self.bytes_written += block.nbytes
        return ArrayInfo(tuple(int(s) for s in shape), dtype.name, rows, self.compression, tuple(checksums))

    @staticmethod
    def _set(array: Any, start: int, stop: int, block: np.ndarray) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr warns about partial last chunks
            array[start:stop] = block

    def _read_back(self, key: str) -> str:
        self.read_back += 1
        logger.debug("checksum of %s read back from %s", key, self.location.url)
        return self.location.checksum(key) or ""

    def write_array(self, path: str, values: np.ndarray) -> ArrayInfo:
        """Write an in-memory array (small ones: indptr, halo IDs)."""
        values = np.asarray(values)
        return self.write(path, values.shape, values.dtype, lambda a, b: values[a:b])

    def commit(self, manifest_json: dict[str, Any]) -> None:
        """Write the manifest into the root group's attributes: the last write of an ingest."""
        def commit() -> None:
            group = zarr.open_group(self._store, mode="r+")
            group.update_attributes({layout.MANIFEST_ATTR: manifest_json})

        self._guard("writing the manifest", commit)
