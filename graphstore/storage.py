"""Where a dataset lives: the one function that turns a user's URL into a location, and local disk."""

from __future__ import annotations

import json
import os
import shutil
import uuid
import zlib
from typing import Any

from graphstore.errors import GraphstoreError
from graphstore import layout

_BLOCK = 1 << 22


class UnsupportedLocationError(GraphstoreError, ValueError):
    """A URL scheme or option graphstore cannot use."""


class LocalLocation:
    """A dataset directory on a local or network (NFS) file system.

    Every chunk has a file path, so readers memory-map chunks in place.
    """

    is_local = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root

    def __repr__(self) -> str:
        return f"LocalLocation({self.root!r})"

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def local_file(self, key: str) -> str | None:
        """The file holding ``key`` (memory-mappable), or ``None`` if absent."""
        path = self.path(key)
        return path if os.path.isfile(path) else None

    def read_bytes(self, key: str) -> bytes | None:
        try:
            with open(self.path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def checksum(self, key: str) -> str | None:
        """``crc32:<hex>`` of the stored bytes of ``key``, streamed; ``None`` if absent."""
        crc = 0
        try:
            with open(self.path(key), "rb") as fh:
                while block := fh.read(_BLOCK):
                    crc = zlib.crc32(block, crc)
        except FileNotFoundError:
            return None
        return f"crc32:{crc:08x}"

    def read_json(self, key: str) -> Any:
        raw = self.read_bytes(key)
        return None if raw is None else json.loads(raw)

    def exists(self) -> bool:
        return os.path.exists(self.root)

    def is_empty(self) -> bool:
        return not os.path.isdir(self.root) or not os.listdir(self.root)

    def zarr_store(self, read_only: bool = True) -> Any:
        from zarr.storage import LocalStore

        return LocalStore(self.root, read_only=read_only)

    # -- writing: ingest writes into a hidden sibling and renames it into place on commit --

    def staging(self) -> LocalLocation:
        """A fresh hidden sibling directory to write a new dataset into (stale ones of dead ingests go)."""
        parent, name = os.path.split(self.root)
        os.makedirs(parent, exist_ok=True)
        for entry in os.listdir(parent):
            if entry.startswith((f".{name}.partial-", f".{name}.old-")) and not _pid_alive(entry):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        return LocalLocation(os.path.join(parent, f".{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"))

    def replace_with(self, staged: LocalLocation) -> None:
        """Move the complete dataset at ``staged`` to this location, replacing what is here."""
        old = None
        if os.path.exists(self.root):
            old = staged.root.replace(".partial-", ".old-")
            os.rename(self.root, old)
        os.rename(staged.root, self.root)
        if old:
            shutil.rmtree(old, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _pid_alive(entry: str) -> bool:
    """Whether the process that named a staging directory ``.<name>.partial-<pid>-<tag>`` still runs."""
    try:
        pid = int(entry.rsplit("-", 2)[-2])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def open_location(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> LocalLocation:
    """Turn anything a user passes as a dataset location into a location object.

    Plain paths, ``~`` paths and ``file://`` URLs are local (an NFS mount is a plain path).

    Examples
    --------
    >>> open_location("file:///tmp/cora").root
    '/tmp/cora'
    """
    url = os.fspath(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "file", url
    if scheme in ("file", "local"):
        if storage_options:
            raise UnsupportedLocationError(
                f"storage_options {sorted(storage_options)} do nothing for the local path {rest!r}; remove them"
            )
        return LocalLocation(rest)
    raise UnsupportedLocationError(
        f"cannot open {url!r}: URL scheme {scheme!r} is not supported by this graphstore version; "
        "use a local or NFS path (or file://)"
    )


def is_dataset(location: LocalLocation) -> bool:
    """Whether ``location`` holds a graphstore dataset (complete or not): its root group names us."""
    doc = location.read_json(layout.ROOT_METADATA)
    return isinstance(doc, dict) and (layout.MANIFEST_ATTR in doc.get("attributes", {}) or
                                      os.path.isdir(location.path(layout.part_key(0))))
