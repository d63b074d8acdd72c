"""Intermediate files of an ingest (the shuffles between stages), under a temporary folder of DEST.

Every stage that moves rows between tasks (edges to the partition owning their destination, the
symmetric adjacency to its bucket, node rows to their partition) writes whole files named by the
item that produced them, so a retried task rewrites the same bytes, and the next stage reads the
files of its own key in name order. The folder lives in the dataset's own location (its file
system and credentials), so every worker that can write the dataset can write these too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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

    def fs(self) -> tuple[Any, str]:
        """The file system of the dataset's location (its own credentials and endpoint) and the folder."""
        inner = self.location
        while isinstance(inner, LocationWrapper):
            inner = inner.inner
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
