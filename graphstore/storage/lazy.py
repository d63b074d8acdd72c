"""Rows of a remote array: chunks fetched into the local cache when first read, mapped into one ndarray."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from graphstore.storage.cache import ChunkCache, ChunkRef
from graphstore.errors import RowIndexError
from graphstore.dataset.manifest import ArrayInfo
from graphstore.storage.mapped import SlotMap, can_map_slots
from graphstore.storage.zarrrows import zarr_rows_from_chunks


class LazyRows:
    """A remote array read through the chunk cache, one ``np.ndarray`` however many chunks it has.

    Uncompressed arrays reserve their whole address range at open; a read first *ensures* its rows:
    it computes the chunks they live in (``rows // chunk_rows``), fetches the missing ones
    concurrently and maps each into its slot, then indexes the array once (a plain fancy index).
    Once every chunk is mapped, :attr:`full` is that ndarray and reads cost what local ones do.
    Compressed arrays (and chunkings that cannot be mapped back to back) are fetched whole on first
    read and decoded through zarr.

    Examples
    --------
    >>> rows = dataset.array("part_00000/nodes/_N/x")  # doctest: +SKIP
    >>> rows[np.array([5, 70_000])]  # fetches the chunks of rows 5 and 70,000 only  # doctest: +SKIP
    """

    def __init__(self, cache: ChunkCache, path: str, info: ArrayInfo) -> None:
        self.path, self.info, self._cache = path, info, cache
        self.shape, self.dtype = tuple(info.shape), np.dtype(info.dtype)
        self.chunk_rows = info.chunk_rows
        self._lock = threading.RLock()
        self._slots: SlotMap | None = None
        self._full: Any = None
        chunk_bytes = ChunkRef(path, info, 0).size
        if self.shape[0] == 0 or chunk_bytes == 0:
            self._full = np.zeros(self.shape, self.dtype)
        elif chunk_bytes is not None and can_map_slots(info.num_chunks, chunk_bytes):
            self._slots = SlotMap(info.num_chunks, chunk_bytes, self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"LazyRows({self.path!r}, shape={self.shape}, dtype={self.dtype}, complete={self.complete})"

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def complete(self) -> bool:
        """Whether every chunk is here (then :attr:`full` is the whole array)."""
        return self._full is not None

    @property
    def full(self) -> Any:
        """The whole array (fetching what is missing): an ``np.ndarray``, or zarr-backed rows if compressed."""
        self.ensure(None)
        return self._full

    def missing(self) -> list[int]:
        """Chunk indices not yet fetched into this array."""
        if self._full is not None:
            return []
        if self._slots is None:
            return list(range(self.info.num_chunks))
        return np.flatnonzero(~self._slots.present).tolist()

    def install(self, ref: ChunkRef, fd: int) -> None:
        """Map the cached chunk open at ``fd`` into its slot (a no-op for whole-array reads)."""
        if self._slots is not None:
            with self._lock:
                self._slots.map(ref.index, fd)
                if self._slots.present.all():
                    self._full = self._slots.array

    def ensure(self, chunks: np.ndarray | None) -> None:
        """Fetch and map the chunks ``chunks`` (``None`` = all) unless they are here already."""
        if self._full is not None:
            return
        with self._lock:
            if self._slots is None:
                self._fetch_whole()
                return
            present = self._slots.present
            need = np.flatnonzero(~present) if chunks is None else np.unique(chunks[~present[chunks]])
            if len(need):
                started = time.perf_counter()
                self._cache.fetch_many([ChunkRef(self.path, self.info, int(i)) for i in need], self.install)
                self._cache.stats.add(self.path, wait_seconds=time.perf_counter() - started)

    def ensure_rows(self, rows: np.ndarray) -> None:
        """Fetch and map the chunks holding ``rows`` (row numbers; negative ones count from the end)."""
        if self._full is not None or len(rows) == 0:
            return
        n = self.shape[0]
        lo, hi = int(rows.min()), int(rows.max())
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise RowIndexError(f"row {bad} is out of bounds for {self.path}, which has {n} rows; "
                                f"use row numbers in [-{n}, {n})")
        if lo < 0:
            rows = np.where(rows < 0, rows + n, rows)
        self.ensure(rows // self.chunk_rows)

    def __getitem__(self, key: Any) -> Any:
        if self._full is None:
            if isinstance(key, np.ndarray) and key.dtype.kind in "iu":
                self.ensure_rows(key.reshape(-1))
            elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                self.ensure_rows(np.array([key], dtype=np.int64))
            elif isinstance(key, slice):
                self._ensure_slice(key)
            else:
                self.ensure(None)
        return (self._full if self._full is not None else self._slots.array)[key]  # type: ignore[union-attr]

    def _ensure_slice(self, key: slice) -> None:
        span = range(*key.indices(self.shape[0]))
        if len(span):
            lo, hi = min(span[0], span[-1]), max(span[0], span[-1])
            self.ensure(np.arange(lo // self.chunk_rows, hi // self.chunk_rows + 1))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self.full)
        return out if dtype is None else out.astype(dtype)

    def _fetch_whole(self) -> None:
        """Compressed (or unmappable) arrays: every chunk into memory, then one array (decoded by zarr)."""
        blobs: dict[int, bytes] = {}

        def keep(ref: ChunkRef, fd: int) -> None:
            with open(fd, "rb", closefd=False) as fh:
                blobs[ref.index] = fh.read()

        started = time.perf_counter()
        refs = [ChunkRef(self.path, self.info, i) for i in range(self.info.num_chunks)]
        self._cache.fetch_many(refs, keep)
        self._cache.stats.add(self.path, wait_seconds=time.perf_counter() - started)
        if self.info.compression == "none":
            flat = np.frombuffer(bytearray().join(blobs[i] for i in range(len(refs))), dtype=np.uint8)
            self._full = flat[: self.shape[0] * self.dtype.itemsize * int(np.prod(self.shape[1:]))].view(
                self.dtype).reshape(self.shape)
        else:
            self._full = zarr_rows_from_chunks(self.path, self.info, blobs)
