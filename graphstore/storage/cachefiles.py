"""File mechanics of the chunk cache: checksums, per-chunk locks, stale temporaries, LRU eviction, atomic writes."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
import uuid
import zlib
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: processes sharing a cache may download a chunk twice)
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

TMP = ".tmp-"  # infix of a download in progress: <chunk file>.tmp-<pid>-<tag>
# what an offline reopen needs (graphstore.storage.offline), never evicted: <cache>/<name>-<hash of URL>/latest.json
# (the version last read online, and when) and <cache>/<name>-<hash of URL>/<digest>/manifest.json (its manifest)
LATEST, MANIFEST_COPY = "latest.json", "manifest.json"
KEEP = frozenset({LATEST, MANIFEST_COPY})


def crc32_file(fd: int) -> str:
    """``crc32:<hex>`` of the whole file open at ``fd``."""
    size = os.fstat(fd).st_size
    if size == 0:
        return f"crc32:{zlib.crc32(b''):08x}"
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as view:
        return f"crc32:{zlib.crc32(view):08x}"


def evict(directory: str, limit: int, verified: dict[str, Any] | None = None) -> int:
    """Delete least recently used cache files until the cache holds at most 90% of ``limit``; return its size.

    Safe while other processes read: a deleted file they have mapped stays readable (POSIX), and
    its disk space returns when they unmap it. Lock files stay (they are empty), and so do the metadata
    files of :data:`KEEP` (without them a cached dataset could not be reopened offline).
    """
    files, total = [], 0
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".lock") or name in KEEP:
                continue
            if TMP in name:
                remove_stale_temporaries(path.split(TMP)[0])
                continue
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(path)
                files.append((st.st_mtime, st.st_size, path))
                total += st.st_size
    if total <= limit:
        return total
    removed = 0
    for _, size, path in sorted(files):
        if total <= int(limit * 0.9):
            break
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed += 1
        total -= size
        (verified or {}).pop(path, None)
    logger.info("cache %s over its limit of %d bytes: evicted %d least recently used files", directory, limit, removed)
    return total


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary name, then ``os.replace``)."""
    tmp = f"{path}{TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def unlink_if(path: str, identity: tuple[int, int, int]) -> None:
    """Delete ``path`` if it is still the file we checked (not a good copy another process just put there)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(path)
        if (st.st_dev, st.st_ino, st.st_size) == identity:
            os.remove(path)


def remove_stale_temporaries(dest: str) -> None:
    """Delete ``<dest>.tmp-<pid>-*`` files of processes that died while downloading."""
    folder, name = os.path.split(dest)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(folder):
            if entry.startswith(name + TMP) and not _alive(entry.rsplit(TMP, 1)[1].split("-")[0]):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, entry))


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class FileLock:
    """An exclusive ``flock`` on ``path``, waiting at most ``timeout`` seconds (then going on without it)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self.fd = -1
        self.locked = False

    def __enter__(self) -> FileLock:
        if fcntl is None:
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline, delay = time.monotonic() + self.timeout, 0.002
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.locked = True
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logger.warning("waited %.0f s for another process downloading %s; downloading it as well",
                                   self.timeout, self.path[:-5])
                    return self
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            if self.locked:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
