"""Where a dataset lives: local disk, wrappers, and the one function turning a URL into a location."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
import zlib
from typing import Any

from graphstore.dataset import layout
from graphstore.errors import (GraphstoreError, StorageError, StorageNotFoundError, StoragePermissionError,
                               UnsupportedLocationError)
from graphstore.storage.location import Location, OnRetry, redact_url
from graphstore.storage.remote import RemoteLocation
from graphstore.storage.retry import RetryPolicy

__all__ = ["FileSlot", "Location", "LocalLocation", "LocationWrapper", "OnRetry", "RemoteLocation",
           "UnsupportedLocationError", "is_dataset", "local_error", "open_location", "redact_url"]

_BLOCK = 1 << 22
_DISK_FULL = "the disk is full: free space there, or choose a DEST on a disk with room"
_NO_ACCESS = "permission denied: choose a DEST you can write, or fix its permissions"
_FIXES = {  # errno -> what to do about it (the path and the action are named before it)
    errno.ENOSPC: _DISK_FULL, errno.EDQUOT: _DISK_FULL, errno.EACCES: _NO_ACCESS, errno.EPERM: _NO_ACCESS,
    errno.EROFS: "the file system is read-only: choose a DEST on a writable one",
    errno.ENOENT: "a directory on the way is missing, or the file system takes no files (/proc, /sys): "
                  "choose a DEST on a disk, in a directory that exists",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another DEST",
    errno.EIO: "the disk reported an I/O error: check it, or choose a DEST on another disk",
}


def local_error(where: str, action: str, exc: OSError, note: str = "") -> GraphstoreError:
    """``exc`` (raised while ``action`` at ``where``) as one line: the path, the error and what to do.

    Examples
    --------
    >>> str(local_error("/data/ds", "writing x", OSError(errno.ENOSPC, "No space left on device")))[:52]
    '/data/ds: writing x failed (No space left on device '
    """
    code = errno.errorcode.get(exc.errno or 0)
    what = f"{exc.strerror or exc}{f' [{code}]' if code else ''}"
    fix = _FIXES.get(exc.errno or 0, "check the disk and the path, or choose another DEST")
    text = f"{where}: {action} failed ({what}){f'; {note}' if note else ''}; {fix}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoragePermissionError(text)
    return StorageNotFoundError(text) if exc.errno == errno.ENOENT else StorageError(text)


class LocalLocation(Location):
    """A dataset directory on a local or network (NFS) file system.

    Every chunk has a file path, so readers memory-map chunks in place.
    """

    is_local = True

    def __init__(self, root: str, shown: str | None = None) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root
        self.shown = shown or self.root  # how errors name it (a staging directory: by its DEST)

    @property
    def local_root(self) -> str:  # type: ignore[override]
        return self.root

    def __repr__(self) -> str:
        return f"LocalLocation({self.root!r})"

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/")) if key else self.root

    def local_file(self, key: str) -> str | None:
        path = self.path(key)
        return path if os.path.isfile(path) else None

    def read_bytes(self, key: str) -> bytes | None:
        try:
            with open(self.path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def checksum(self, key: str) -> str | None:
        crc = 0
        try:
            with open(self.path(key), "rb") as fh:
                while block := fh.read(_BLOCK):
                    crc = zlib.crc32(block, crc)
        except FileNotFoundError:
            return None
        return f"crc32:{crc:08x}"

    def download(self, key: str, dest: str, on_retry: OnRetry | None = None) -> int | None:
        try:
            shutil.copyfile(self.path(key), dest)
        except FileNotFoundError:
            return None
        return os.path.getsize(dest)

    def exists(self) -> bool:
        return os.path.exists(self.root)

    def is_empty(self) -> bool:
        return not os.path.isdir(self.root) or not os.listdir(self.root)

    def has(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def keys(self) -> list[str] | None:
        found = []
        for base, dirs, files in os.walk(self.root):
            rel = os.path.relpath(base, self.root)
            found += [name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}" for name in files]
            found += [f"{'' if rel == '.' else rel.replace(os.sep, '/') + '/'}{name}" for name in dirs
                      if os.path.islink(os.path.join(base, name))]  # a link to a folder: kept whole, not walked
        return sorted(found)

    def zarr_store(self, read_only: bool = True) -> Any:
        from zarr.storage import LocalStore

        return LocalStore(self.root, read_only=read_only)

    def remove_key(self, key: str) -> None:
        try:
            os.remove(self.path(key))
        except FileNotFoundError:
            pass

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def storage_error(self, exc: BaseException, action: str) -> BaseException:
        """A file-system error (full, read-only, permissions) as one line naming this location and the fix."""
        if isinstance(exc, OSError) and not isinstance(exc, GraphstoreError):
            return local_error(self.shown, action, exc)
        return exc

    def claim_slot(self) -> FileSlot:
        """Where an ingest into this directory keeps its claim: a file beside it (see graphstore.ingest.claim)."""
        parent, name = os.path.split(self.root)
        return FileSlot(os.path.join(parent, layout.ingest_claim(name)))

    # -- writing: ingest writes into a hidden sibling and renames it into place on commit --

    def staging(self) -> LocalLocation:
        """A fresh hidden sibling directory to write a new dataset into (stale ones of dead ingests go).

        The parent directory must exist: a missing one is never created here (a mistyped mount path
        would otherwise put the dataset on the wrong disk).
        """
        parent, name = os.path.split(self.root)
        for entry in os.listdir(parent):
            if entry.startswith((f".{name}.partial-", f".{name}.old-")) and not _pid_alive(entry):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        staged = os.path.join(parent, f".{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        return LocalLocation(staged, shown=self.shown)

    def replace_with(self, staged: LocalLocation) -> None:
        """Move the complete dataset at ``staged`` to this location, replacing what is here."""
        old = None
        if os.path.lexists(self.root) and not os.path.isdir(self.root):  # never move a user's file aside
            raise FileExistsError(f"{self.root} is a file, not a dataset directory; refusing to replace it")
        if os.path.exists(self.root):
            old = staged.root.replace(".partial-", ".old-")
            os.rename(self.root, old)
        os.rename(staged.root, self.root)
        if old:
            shutil.rmtree(old, ignore_errors=True)


class LocationWrapper(Location):
    """A location that forwards every call to ``inner``: subclass it to observe or alter reads.

    A wrapper is never memory-mapped in place (``is_local`` is false), so every chunk read goes
    through :meth:`download` and the local chunk cache: the hook for latency simulation, request
    recording and fault injection in tests and benchmarks.

    Examples
    --------
    >>> class Counting(LocationWrapper):
    ...     calls = 0
    ...     def download(self, key, dest, on_retry=None):
    ...         type(self).calls += 1
    ...         return super().download(key, dest, on_retry)
    """

    def __init__(self, inner: Location) -> None:
        self.inner = inner
        self.url = inner.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    def read_bytes(self, key: str) -> bytes | None:
        return self.inner.read_bytes(key)

    def checksum(self, key: str) -> str | None:
        return self.inner.checksum(key)

    def download(self, key: str, dest: str, on_retry: OnRetry | None = None) -> int | None:
        return self.inner.download(key, dest, on_retry)

    def exists(self) -> bool:
        return self.inner.exists()

    def is_empty(self) -> bool:
        return self.inner.is_empty()

    def has(self, key: str) -> bool:
        return self.inner.has(key)

    def keys(self) -> list[str] | None:
        return self.inner.keys()

    def zarr_store(self, read_only: bool = True) -> Any:
        return self.inner.zarr_store(read_only)

    def remove_key(self, key: str) -> None:
        self.inner.remove_key(key)

    def remove(self) -> None:
        self.inner.remove()

    def check_container(self) -> None:
        self.inner.check_container()

    def storage_error(self, exc: BaseException, action: str) -> BaseException:
        return self.inner.storage_error(exc, action)

    def claim_slot(self) -> Any:
        """The inner location's ingest claim slot (``None`` where it has none)."""
        slot = getattr(self.inner, "claim_slot", None)
        return slot() if slot is not None else None


class FileSlot:
    """An ingest claim as a file made with ``O_CREAT | O_EXCL``: of several creators exactly one wins, on
    any POSIX file system (NFS v3 and later included)."""

    def __init__(self, path: str) -> None:
        self.path = self.where = path

    def create(self, data: bytes) -> bool:
        """Create the claim holding ``data``; ``False`` if there is one already."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            self.remove()  # a claim nobody could read (the disk filled, say) would block every later ingest
            raise
        return True

    def read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def set_aside(self, stale: bytes) -> None:
        """Remove the claim if it still holds ``stale`` (a dead ingest's), atomically: it is renamed away
        first, so of two processes clearing it only one moves it; one that moved a fresh claim (taken
        by another in between) puts it back."""
        aside = f"{self.path}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            with open(aside, "rb") as fh:
                moved = fh.read()
            if moved != stale:
                try:
                    os.link(aside, self.path)  # fails if a third took the claim meanwhile: theirs stands
                except FileExistsError:
                    pass
                except OSError:  # a file system without hard links
                    self.create(moved)
        finally:
            os.remove(aside)


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


def open_location(url: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None, *,
                  retry: RetryPolicy | None = None) -> Location:
    """Turn anything a user passes as a dataset location into a location object.

    Plain paths, ``~`` paths and ``file://`` URLs are local (an NFS mount is a plain path); any other
    fsspec URL (``s3://``, ``gs://``, ``az://``, ...) is remote and takes ``storage_options`` (passed to
    the fsspec file system; options it does not accept are refused) and a ``retry`` policy. A
    :class:`Location` is returned as is.

    Examples
    --------
    >>> open_location("file:///tmp/cora").root
    '/tmp/cora'
    >>> open_location("s3://bucket/cora", {"anon": True}).url  # doctest: +SKIP
    's3://bucket/cora'
    """
    if isinstance(url, Location):
        if storage_options or retry is not None:
            raise UnsupportedLocationError(f"{url!r} is already a location: storage_options and retry apply to "
                                           "URLs only; remove them")
        return url
    url = os.fspath(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme in ("file", "local"):
        rest = rest if sep else url
        unused = [name for name, value in (("storage_options", storage_options), ("retry", retry)) if value]
        if unused:
            keys = sorted(storage_options) if storage_options else []
            raise UnsupportedLocationError(f"{' and '.join(unused)} {keys or ''} do nothing for the local path "
                                           f"{rest!r}; remove them")
        return LocalLocation(rest)
    return RemoteLocation(url, storage_options, retry=retry)


def is_dataset(location: Location) -> bool:
    """Whether ``location`` holds a graphstore dataset (complete or not): its root group names us."""
    doc = location.read_json(layout.ROOT_METADATA)
    return isinstance(doc, dict) and (layout.MANIFEST_ATTR in doc.get("attributes", {}) or
                                      location.has(layout.part_key(0)))
