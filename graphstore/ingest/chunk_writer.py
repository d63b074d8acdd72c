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
from zarr.core.sync import sync
from zarr.storage import MemoryStore, StorePath, WrapperStore

from graphstore.dataset import layout
from graphstore.errors import GraphstoreError, InvalidInputError
from graphstore.dataset.manifest import ArrayInfo
from graphstore.storage.local import Location

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

    An ingest's writers write into a location its root group has just cleared, where every array path is
    new, or was begun by an earlier try of the same task (the same shape, every chunk rewritten): they
    store an array's metadata and its parent groups' as their documents (one write each, the parents
    once per writer) instead of zarr's reads of what is there and a delete of the path (on object storage,
    each a request or more). A writer into an existing dataset (:mod:`graphstore.outputs.writer`) is not
    ``fresh``: zarr's checks and delete stay.
    """

    _fresh = False  # see the class docstring; a subclass that skips __init__ keeps zarr's checks

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
        self._fresh, self._stored = True, set[str]()  # _stored: the metadata documents this writer stored
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
        stream = self.stream(path, shape, dtype, check)
        for start in range(0, shape[0], stream.chunk_rows):
            stream.append(fill(start, min(start + stream.chunk_rows, shape[0])))
        return stream.close()

    def stream(self, path: str, shape: tuple[int, ...], dtype: Any,
               check: Callable[[np.ndarray, int], None] | None = None) -> StreamArray:
        """Create array ``path`` of ``shape`` to be filled in row order by :meth:`StreamArray.append`."""
        dtype = np.dtype(dtype)
        rows = chunk_rows_for(shape[0], tuple(shape[1:]), dtype, self.chunk_bytes)
        options = dict(shape=shape, chunks=(rows, *shape[1:]), dtype=dtype, fill_value=0,
                       compressors=None if self.compression == "none" else zarr.codecs.ZstdCodec(level=3),
                       config={"write_empty_chunks": True})
        array = self._guard(f"creating {path}", lambda: self._create(path, options))
        return StreamArray(self, path, array, tuple(int(s) for s in shape), dtype, rows, check)

    def _create(self, path: str, options: dict[str, Any]) -> Any:
        """The zarr array ``path``, its metadata stored (see the class docstring)."""
        if not self._fresh or f"{path}/zarr.json" in self._stored:  # replaced: zarr deletes what is there
            return zarr.create_array(self._store, name=path, overwrite=True, **options)
        documents: dict[str, Any] = {}
        made = zarr.create_array(MemoryStore(documents), name=path, **options)  # the documents, no request
        for key, document in documents.items():
            if key != "zarr.json" and key not in self._stored:  # the root group is the location's own
                sync(self._store.set(key, document))
                self._stored.add(key)
        return zarr.Array(zarr.AsyncArray(made.metadata, StorePath(self._store, path), made.async_array.config))

    def _write_chunk(self, array: Any, path: str, index: int, start: int, block: np.ndarray) -> str:
        """Store one whole chunk; return its checksum."""
        key = layout.chunk_key(path, index, array.ndim)
        self._guard(f"writing {key}", lambda: self._set(array, start, start + len(block), block))
        self.bytes_written += block.nbytes
        return self._store.checksums.pop(key, None) or self._read_back(key)

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


class StreamArray:
    """One array being written in row order from pieces of any length; whole chunks are stored as
    they fill, so a writer holds at most one chunk of it (the piece being appended is the caller's:
    its whole chunks are stored straight from it, only a partial chunk is copied and kept)."""

    def __init__(self, writer: ArrayWriter, path: str, array: Any, shape: tuple[int, ...], dtype: np.dtype,
                 chunk_rows: int, check: Callable[[np.ndarray, int], None] | None) -> None:
        self.writer, self.path, self.array, self.shape, self.dtype = writer, path, array, shape, dtype
        self.chunk_rows, self.check = chunk_rows, check
        self.rows = 0  # rows appended so far
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self._checksums: list[str] = []

    def append(self, piece: np.ndarray) -> None:
        """Append rows ``self.rows ..`` (their per-row shape must be the array's)."""
        piece = np.ascontiguousarray(piece, dtype=self.dtype)
        if piece.shape[1:] != self.shape[1:] or self.rows + len(piece) > self.shape[0]:
            raise InvalidInputError(f"{self.path}: rows {self.rows}:{self.rows + len(piece)} came with shape "
                                    f"{piece.shape}, but the array has shape {self.shape}")
        if self.check is not None and len(piece):
            self.check(piece, self.rows)
        self.rows += len(piece)
        while len(piece):
            if not self._pending_rows and len(piece) >= self.chunk_rows:  # a whole chunk: stored from the piece
                self._write(piece[: self.chunk_rows])
                piece = piece[self.chunk_rows:]
                continue
            take = min(self.chunk_rows - self._pending_rows, len(piece))
            self._pending.append(piece[:take].copy())  # a copy: the caller's piece is not kept alive
            self._pending_rows += take
            piece = piece[take:]
            if self._pending_rows == self.chunk_rows:
                self._flush()

    def _flush(self) -> None:
        block = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        self._pending, self._pending_rows = [], 0
        self._write(block)

    def _write(self, block: np.ndarray) -> None:
        start = len(self._checksums) * self.chunk_rows
        self._checksums.append(self.writer._write_chunk(self.array, self.path, len(self._checksums), start, block))

    def close(self) -> ArrayInfo:
        """Store the last, partial chunk; the array must be complete. Returns its manifest entry."""
        if self.rows != self.shape[0]:
            raise InvalidInputError(f"{self.path}: {self.rows} rows were written of {self.shape[0]}")
        if self._pending_rows:
            self._flush()
        return ArrayInfo(self.shape, self.dtype.name, self.chunk_rows, self.writer.compression,
                         tuple(self._checksums))
