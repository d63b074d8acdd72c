"""Intermediate files of an ingest (the shuffles between stages), under a temporary folder of DEST.

Every stage that moves rows between tasks (edges to the partition owning their destination, the
symmetric adjacency to its bucket, node rows to their partition) writes whole files named by the
item that produced them, so a retried task rewrites the same bytes, and the next stage reads the
files of its own key in name order. Per-node arrays every task of a stage reads (labels, a
partition, the books' ID maps) are ``.npy`` files too (:class:`StoredArray`): tasks map them instead of
receiving copies through the scheduler. The folder lives in the dataset's own location (its file
system and credentials), so every worker that can write the dataset can write these too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np

from graphstore.storage.local import LocalLocation, Location, LocationWrapper

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scratch:
    """The folder ``name`` inside the dataset being written at ``location``."""

    location: Location
    name: str

    def _inner(self) -> Location:
        inner = self.location
        while isinstance(inner, LocationWrapper):
            inner = inner.inner
        return inner

    def fs(self) -> tuple[Any, str]:
        """The file system of the dataset's location (its own credentials and endpoint) and the folder."""
        inner = self._inner()
        if isinstance(inner, LocalLocation):
            return fsspec.filesystem("file"), f"{inner.root}/{self.name}"
        return inner.fs, f"{inner.root.rstrip('/')}/{self.name}"  # a RemoteLocation

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> int:
        """Write ``arrays`` as the file ``key`` (a ``/``-separated path below the folder); return its bytes."""
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        fs, root = self.fs()
        path = f"{root}/{key}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            f.write(buffer.getvalue())
        return buffer.tell()

    def keys(self, prefix: str) -> list[str]:
        """The files below ``prefix``, in name order (written by other processes: listed afresh)."""
        fs, root = self.fs()
        folder = f"{root}/{prefix}"
        fs.invalidate_cache()
        if not fs.exists(folder):
            return []
        return sorted(p for p in fs.find(folder) if not p.endswith("/"))

    def load(self, path: str) -> dict[str, np.ndarray]:
        """The arrays of one file listed by :meth:`keys`."""
        fs, _ = self.fs()
        with fs.open(path, "rb") as f, np.load(io.BytesIO(f.read())) as npz:
            return {k: npz[k] for k in npz.files}

    def pieces(self, prefix: str) -> Iterator[dict[str, np.ndarray]]:
        """The arrays of every file below ``prefix``, one file at a time, in name order."""
        for path in self.keys(prefix):
            yield self.load(path)

    def concat(self, prefix: str, empty: dict[str, np.dtype]) -> dict[str, np.ndarray]:
        """Every file below ``prefix`` joined array by array (``empty`` gives the dtypes when none exists)."""
        joined: dict[str, list[np.ndarray]] = {}
        for piece in self.pieces(prefix):
            for name, values in piece.items():
                joined.setdefault(name, []).append(values)
        if not joined:
            return {name: np.zeros(0, dtype) for name, dtype in empty.items()}
        return {name: np.concatenate(parts) for name, parts in joined.items()}

    def remove(self, prefix: str) -> None:
        """Delete the files below ``prefix`` (a stage's input, once it is consumed)."""
        fs, root = self.fs()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{prefix}", recursive=True)

    def clear(self) -> None:
        """Delete the folder and everything in it (it is made again by the next file written)."""
        fs, root = self.fs()
        fs.invalidate_cache()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root, recursive=True)

    def keep_only(self, name: str) -> None:
        """Delete everything in the folder but the entry ``name`` (what a later stage still reads)."""
        fs, root = self.fs()
        fs.invalidate_cache()
        for path in fs.ls(root, detail=False) if fs.exists(root) else []:
            if path.rstrip("/").rsplit("/", 1)[-1] != name:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(path, recursive=True)

    def local_path(self, key: str) -> str | None:
        """The path of the file ``key`` on this machine's file system; None when the folder is remote."""
        inner = self._inner()
        return f"{inner.root}/{self.name}/{key}" if isinstance(inner, LocalLocation) else None

    def put_array(self, key: str, values: np.ndarray) -> StoredArray:
        """Write one array as the ``.npy`` file ``key`` and return its handle (see :class:`StoredArray`)."""
        values = np.ascontiguousarray(values)
        fs, root = self.fs()
        path = f"{root}/{key}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            np.lib.format.write_array(f, values, allow_pickle=False)
        return StoredArray(self, key, tuple(int(n) for n in values.shape), values.dtype.str)


@dataclass
class StoredArray:
    """A per-node array (a partition map, labels, a relabelling) that tasks read from a scratch file.

    Shared inputs of a Dask stage travel inside the task graph: the client and the scheduler each hold a
    pickled copy and every worker one more. A handle is a few bytes instead; on a local disk a task maps
    the file and touches only the pages it reads (a slice: just those rows). Elsewhere it reads it whole.
    """

    scratch: Scratch
    key: str
    shape: tuple[int, ...]
    dtype: str
    _mapped: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": None}  # a memory map never travels: reopened where it is read

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.mapped()[index]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def mapped(self) -> np.ndarray:
        """The array to read: memory-mapped on a local disk (opened once per process; copy-on-write, so it has
        the type of an array in memory and the kernels compiled for one), else read whole."""
        if self._mapped is None:
            path = self.scratch.local_path(self.key)
            self._mapped = np.asarray(np.load(path, mmap_mode="c")) if path is not None else self.load()
        return self._mapped

    def load(self) -> np.ndarray:
        """A private, writable copy of the whole array."""
        path = self.scratch.local_path(self.key)
        if path is not None:
            return np.load(path)
        fs, root = self.scratch.fs()
        with fs.open(f"{root}/{self.key}", "rb") as f:
            return np.lib.format.read_array(f, allow_pickle=False)

    def remove(self) -> None:
        self._mapped = None
        self.scratch.remove(self.key)


@contextlib.contextmanager
def scratch_dir(location: Location) -> Iterator[Scratch]:
    """A fresh temporary folder ``.routing-<token>`` in the dataset at ``location``, removed at the end."""
    scratch = Scratch(location, f".routing-{uuid.uuid4().hex[:12]}")
    try:
        yield scratch
    finally:
        fs, root = scratch.fs()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root, recursive=True)
        logger.debug("removed the intermediate files at %s/%s", location.url, scratch.name)
