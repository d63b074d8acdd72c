"""The local chunk cache of remote datasets: fetch each chunk once, verify it, share it between processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.dataset import layout
from graphstore.errors import ConfigError, CorruptDatasetError, StorageError
from graphstore.storage.cachefiles import TMP, FileLock, crc32_file, evict, remove_stale_temporaries, unlink_if
from graphstore.storage.iostats import IOStats
from graphstore.dataset.manifest import ArrayInfo, Manifest
from graphstore.storage.local import Location

logger = logging.getLogger(__name__)

ENV_DIR, ENV_MAX_BYTES = "GRAPHSTORE_CACHE_DIR", "GRAPHSTORE_CACHE_MAX_BYTES"
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(value: int | str | None, where: str) -> int | None:
    """Bytes from ``10GB``, ``512MiB``, ``1e9``-free integers or an int; ``None`` stays ``None``.

    Examples
    --------
    >>> parse_size("2GiB", "--cache-max-bytes")
    2147483648
    """
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ConfigError(f"{where} {value!r} is not a size; write bytes as 5000000000, 5GB or 4GiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def default_cache_dir() -> str:
    """``$GRAPHSTORE_CACHE_DIR``, else the platform's user cache directory + ``graphstore``."""
    if os.environ.get(ENV_DIR):
        return os.path.expanduser(os.environ[ENV_DIR])
    if sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "graphstore")


@dataclass(frozen=True)
class CacheConfig:
    """Where and how remote chunks are cached.

    ``directory`` (default ``$GRAPHSTORE_CACHE_DIR`` or ``~/.cache/graphstore``), ``max_bytes`` (default
    ``$GRAPHSTORE_CACHE_MAX_BYTES``, else unbounded; least recently used files go first), ``concurrency``
    (chunk downloads in flight per read), ``lock_timeout`` (seconds to wait for another process
    downloading the same chunk before downloading it too).

    Examples
    --------
    >>> CacheConfig(directory="/tmp/gs-cache", max_bytes="20GB").max_bytes
    20000000000
    """

    directory: str | None = None
    max_bytes: int | str | None = None
    concurrency: int = 16
    lock_timeout: float = 600.0

    def __post_init__(self) -> None:
        directory = self.directory if self.directory is not None else default_cache_dir()
        object.__setattr__(self, "directory", os.path.abspath(os.path.expanduser(os.fspath(directory))))
        from_env = self.max_bytes is None and bool(os.environ.get(ENV_MAX_BYTES))
        where = f"${ENV_MAX_BYTES}" if from_env else "cache_max_bytes"  # name what the user set
        limit = parse_size(os.environ[ENV_MAX_BYTES] if from_env else self.max_bytes, where)
        if limit is not None and limit <= 0:
            raise ConfigError(f"{where} {limit} is invalid: give a positive size, or "
                              f"{'unset it' if from_env else 'None'} for no limit")
        object.__setattr__(self, "max_bytes", limit)
        if not isinstance(self.concurrency, int) or not 1 <= self.concurrency <= 256:
            raise ConfigError(f"concurrency {self.concurrency!r} is invalid: give an integer in 1..256")
        if not self.lock_timeout > 0:
            raise ConfigError(f"lock_timeout {self.lock_timeout!r} is invalid: give seconds > 0")


@dataclass(frozen=True)
class ChunkRef:
    """Chunk ``index`` of the array at ``path``."""

    path: str
    info: ArrayInfo
    index: int

    @property
    def key(self) -> str:
        return layout.chunk_key(self.path, self.index, len(self.info.shape))

    @property
    def size(self) -> int | None:
        """The exact stored size of an uncompressed chunk; ``None`` when compressed."""
        if self.info.compression != "none":
            return None
        row = np.dtype(self.info.dtype).itemsize * int(np.prod(self.info.shape[1:], dtype=np.int64))
        return self.info.chunk_rows * row


def url_dir(url: str) -> str:
    """The cache subdirectory of every version of the dataset at ``url``: ``<name>-<hash of URL>``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "dataset"
    return f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def dataset_dir(url: str, digest: str) -> str:
    """The cache subdirectory of one dataset version: ``<name>-<hash of URL>/<manifest digest>``."""
    return os.path.join(url_dir(url), digest)


def version_digest(manifest: Manifest) -> str:
    """The hash naming one dataset version in the cache: of the manifest as ingest wrote it, so a re-ingested
    dataset never reuses stale chunks, and committing derived arrays (graphstore.outputs.writer) keeps every
    cached chunk (crc32 tells a replaced output's chunks apart)."""
    base = manifest.without_outputs().to_json()
    base.pop("outputs")
    return hashlib.sha256(json.dumps(base, sort_keys=True).encode()).hexdigest()[:16]


def missing_error(url: str, directory: str, path: str, lost: int, total: int) -> StorageError:
    """The one-line refusal to read array ``path`` of ``url``, served offline, with ``lost`` of its ``total``
    chunks not in the cache ``directory`` (a read never gets zeros in their place)."""
    return StorageError(
        f"{url} is served offline, and {lost} of {total} chunks of {path} are not in the cache {directory}; "
        f"reconnect to {url} (and, while it is reachable, fetch every chunk with `graphstore info {url} "
        f"--prefetch all --cache-dir {directory}`)"
    )


class ChunkCache:
    """Chunks of one remote dataset version in a local directory, fetched once and shared by processes.

    A chunk is downloaded under a per-chunk ``flock`` (bounded wait) to a temporary name, checked
    against the manifest's crc32, and ``os.replace``-d into place, so readers never see a torn file
    and processes on one machine download each chunk once. A cached chunk is checked (size and crc32)
    when a process first opens it and fetched again if damaged. Counters go to ``stats``.
    """

    def __init__(self, location: Location, digest: str, config: CacheConfig, stats: IOStats) -> None:
        self.location, self.config, self.stats = location, config, stats
        self.root = os.path.join(str(config.directory), dataset_dir(location.url, digest))
        self._verified: dict[str, tuple[int, int, int]] = {}  # files checked by this process: path -> identity
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._usage: int | None = None  # bytes in the cache directory, as last counted plus our downloads
        self._usage_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a ChunkCache belongs to one process; pickle the Dataset, which reopens its cache")

    def file(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_pid != os.getpid():  # threads do not survive a fork
            self._pool = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="graphstore-fetch")
            self._pool_pid = os.getpid()
        return self._pool

    def fetch_many(self, refs: Sequence[ChunkRef], install: Callable[[ChunkRef, int], None],
                   progress: Callable[[int, int], None] | None = None) -> None:
        """Open every chunk of ``refs`` from the cache or download it, ``concurrency`` at a time.

        ``install(ref, fd)`` runs in the calling thread for each chunk as it arrives (``fd`` is closed
        afterwards). If any chunk fails, the others still finish and the first error is raised.
        """
        futures = self._submit(refs)
        owner = {id(f): ref for f, ref in zip(futures, refs)}
        error: BaseException | None = None
        for done, future in enumerate(as_completed(futures), 1):
            try:
                fd = future.result()
            except BaseException as exc:  # noqa: BLE001  (raised below, once every other chunk is settled)
                error = error or exc
                continue
            try:
                install(owner[id(future)], fd)
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
            finally:
                os.close(fd)
            if progress is not None:
                progress(done, len(refs))
        self._maybe_evict()
        if error is not None:
            raise error

    def _submit(self, refs: Sequence[ChunkRef]) -> list[Future[int]]:
        if len(refs) != 1:
            return [self._executor().submit(self.open_chunk, ref) for ref in refs]
        future: Future[int] = Future()  # one chunk: no thread hop
        try:
            future.set_result(self.open_chunk(refs[0]))
        except BaseException as exc:  # noqa: BLE001  (delivered through the future)
            future.set_exception(exc)
        return [future]

    @property
    def offline(self) -> bool:
        """Whether this dataset is served from the cache alone (its location sends no request)."""
        return getattr(self.location, "offline", None) is True

    def missing(self, path: str, info: ArrayInfo) -> list[int]:
        """Chunks of the array at ``path`` with no whole file in the cache (``os.stat`` only)."""
        refs = (ChunkRef(path, info, i) for i in range(info.num_chunks))
        return [ref.index for ref in refs if not _whole(self.file(ref.key), ref.size)]

    def open_chunk(self, ref: ChunkRef) -> int:
        """A read-only fd of the verified cache file of ``ref``, downloading it first if needed (offline: a
        :class:`StorageError` naming what the cache lacks, never a request and never zeros)."""
        dest = self.file(ref.key)
        fd = self._open_valid(dest, ref)
        if fd is None and self.offline:
            lost = max(len(self.missing(ref.path, ref.info)), 1)  # 1: the file is there, but damaged
            raise missing_error(self.location.url, str(self.config.directory), ref.path, lost, ref.info.num_chunks)
        if fd is None:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with FileLock(dest + ".lock", self.config.lock_timeout):
                fd = self._open_valid(dest, ref)  # another process may have fetched it meanwhile
                if fd is None:
                    fd = self._download(ref, dest)
                    self.stats.add(ref.path, misses=1)
                    return fd
        self.stats.add(ref.path, hits=1)
        return fd

    def _open_valid(self, dest: str, ref: ChunkRef) -> int | None:
        try:
            fd = os.open(dest, os.O_RDONLY)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_size)
        if self._verified.get(dest) != identity:
            expected = ref.info.checksums[ref.index]
            found = None if ref.size not in (None, st.st_size) else crc32_file(fd)
            if found != expected:
                os.close(fd)
                logger.warning("%s: cached chunk %d of %s is damaged (%s); %s", self.location.url, ref.index, ref.path,
                               f"{st.st_size} bytes" if found is None else found,
                               "deleting it" if self.offline else "fetching it again")
                unlink_if(dest, identity)
                return None
            self._verified[dest] = identity
        with contextlib.suppress(OSError):
            os.utime(dest)  # least recently used goes first on eviction
        return fd

    def _download(self, ref: ChunkRef, dest: str) -> int:
        remove_stale_temporaries(dest)
        found = None
        for _ in range(2):  # a damaged download is fetched once more
            tmp = f"{dest}{TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                fd, found = self._download_once(ref, tmp)
                if fd is not None:
                    os.replace(tmp, dest)
                    st = os.fstat(fd)
                    self._verified[dest] = (st.st_dev, st.st_ino, st.st_size)
                    self._count_usage(st.st_size)
                    return fd
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
            logger.warning("%s: chunk %d of %s arrived damaged (%s); fetching it again", self.location.url, ref.index,
                           ref.path, found)
        raise CorruptDatasetError(
            f"{self.location.url}: chunk {ref.index} of array {ref.path} ({ref.key}) failed its checksum twice after "
            f"download ({found}, the manifest says {ref.info.checksums[ref.index]}): the stored chunk is damaged; "
            f"run `graphstore verify {self.location.url}` and re-ingest the dataset"
        )

    def _download_once(self, ref: ChunkRef, tmp: str) -> tuple[int | None, str]:
        """Download ``ref`` to ``tmp``; return an fd on it if it checks out, and what was found."""
        def retried(exc: BaseException) -> None:
            self.stats.add(ref.path, requests=1, retries=1)

        size = None
        try:
            size = self.location.download(ref.key, tmp, on_retry=retried)
        finally:
            self.stats.add(ref.path, requests=1, nbytes=size or 0)
        if size is None:
            raise CorruptDatasetError(
                f"{self.location.url}: chunk {ref.index} of array {ref.path} ({ref.key}) is missing from storage; "
                f"run `graphstore verify {self.location.url}` and re-ingest"
            )
        fd = os.open(tmp, os.O_RDONLY)
        found = f"{size} bytes, expected {ref.size}" if ref.size not in (None, size) else crc32_file(fd)
        if found == ref.info.checksums[ref.index]:
            return fd, found
        os.close(fd)
        return None, found

    def stored_checksums(self, refs: Sequence[ChunkRef]) -> Iterator[str | None]:
        """``crc32:<hex>`` of each chunk as stored remotely (``None`` if missing), read concurrently, in order."""
        def stored(ref: ChunkRef) -> str | None:
            raw = self.location.read_bytes(ref.key)
            self.stats.add(ref.path, requests=1, nbytes=len(raw or b""))
            return None if raw is None else f"crc32:{zlib.crc32(raw):08x}"

        return self._executor().map(stored, refs)

    # -- size limit --

    def _count_usage(self, nbytes: int) -> None:
        with self._usage_lock:
            if self._usage is not None:
                self._usage += nbytes

    def _maybe_evict(self) -> None:
        limit = self.config.max_bytes
        if limit is None:
            return
        with self._usage_lock:
            if self._usage is None or self._usage > int(limit):
                self._usage = evict(str(self.config.directory), int(limit), self._verified)


def _whole(file: str, size: int | None) -> bool:
    """Whether ``file`` exists with ``size`` bytes (any size when ``None``: compressed)."""
    try:
        return size is None or os.stat(file).st_size == size
    except FileNotFoundError:
        return False
