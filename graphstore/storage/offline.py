"""Reopen a remote dataset from the local chunk cache while its store is unreachable (or when asked to).

Opening a remote dataset reads one document from the store, its root ``zarr.json``, for the manifest in it
(shapes, dtypes, every chunk's crc32); chunks then come through the cache. So whenever a process reads an
online dataset through the cache, the manifest is kept beside that version's chunks, and a note says which
version was read online last, and when::

    <cache dir>/<name>-<hash of URL>/latest.json               {"url", "digest", "online_at"}
    <cache dir>/<name>-<hash of URL>/<digest>/manifest.json     the manifest of that version
    <cache dir>/<name>-<hash of URL>/<digest>/part_.../c/0/0    its chunks

Reopened offline, a dataset is exactly that version (a changed remote dataset has another digest, so its
chunks never mix with these). Reads are served by the chunks in the cache; a read needing one that is not
there is refused, naming the array (:meth:`~graphstore.storage.cache.ChunkCache.open_chunk`), never zeros.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphstore.dataset.manifest import Manifest
from graphstore.errors import DatasetNotFoundError, GraphstoreError
from graphstore.storage.cache import ChunkCache, dataset_dir, url_dir, version_digest
from graphstore.storage.cachefiles import LATEST, MANIFEST_COPY, write_atomic
from graphstore.storage.location import Location
from graphstore.storage.remote import RemoteLocation
from graphstore.storage.retry import causes, is_transient, is_unreachable

logger = logging.getLogger(__name__)

# URLs already announced as served from the cache by this process or the one that started it (a training
# launcher and its ranks): one warning line per job, not one per process
NOTED_ENV = "GRAPHSTORE_OFFLINE_NOTED"
ReadManifest = Callable[[Location], tuple[bytes, Any]]  # location -> (root metadata bytes, manifest JSON)


@dataclass(frozen=True)
class Opened:
    """A remote dataset's manifest and where it came from: ``offline`` says why the cache served it, ``as_of``
    when that copy was last read online (both ``None``: read from the store now), ``warn`` whether that is
    news to the user (the store could not be reached) rather than what they asked for."""

    location: Location
    raw: bytes  # the root metadata as read from the store (empty when served from the cache)
    manifest: Manifest
    offline: str | None = None
    as_of: str | None = None
    warn: bool = False


def read_manifest(location: Location, directory: str, read: ReadManifest) -> Opened:
    """The manifest of ``location``: from the store, or from the cache ``directory`` when the store cannot be
    connected to (storage option ``offline`` absent) or must not be asked (``offline=true``).

    With a copy in the cache, the first request is bounded (:meth:`RemoteLocation.bounded`), so a store
    that cannot be reached is found within seconds. Any other error (access denied, no such bucket, no
    dataset there) is raised as before; a transient one is retried as before.
    """
    if not isinstance(location, RemoteLocation) or location.offline is False:
        return _online(location, read(location))
    found = load(directory, location.url)
    if location.offline:
        if found is None:
            raise DatasetNotFoundError(
                f"{location.url} was opened offline (storage option offline=true), but the cache {directory} holds "
                "no copy of it: read it once through this cache directory while the store is reachable, or drop "
                "offline=true"
            )
        return Opened(location, b"", found[0], "opened offline (storage option offline=true)", found[1])
    if found is None:
        return _online(location, read(location))
    try:
        answer = read(location.bounded())
    except Exception as exc:
        if is_unreachable(exc):
            cause = next(err for err in reversed(causes(exc)) if is_unreachable(err))
            why = f"the store is unreachable ({type(cause).__name__})"
            return Opened(location.offline_copy(), b"", found[0], why, found[1], warn=True)
        if not is_transient(exc):
            raise
        answer = read(location)  # the store answered, with a blip: the usual retries
    return _online(location, answer)


def announce(cache: ChunkCache, opened: Opened) -> None:
    """Say in one line that the dataset is served from the cache, as of when, and how much of it is there:
    a warning when the store could not be reached (once per job: a launcher's ranks stay quiet), else info."""
    arrays = opened.manifest.arrays
    total = sum(info.num_chunks for info in arrays.values())
    lost = sum(len(cache.missing(path, info)) for path, info in arrays.items())
    short = f"; {total - lost} of {total} chunks are cached, and a read needing another is refused" if lost else ""
    url = cache.location.url
    text = (f"{url}: {opened.offline}; serving the dataset from the local cache {cache.config.directory} as of "
            f"{opened.as_of} (when it was last read online): changes since then are not seen{short}")
    noted = os.environ.get(NOTED_ENV, "").split("\n")
    if not opened.warn or url in noted:
        logger.info(text)
        return
    logger.warning(text)
    os.environ[NOTED_ENV] = "\n".join([*filter(None, noted), url])


def remember(cache: ChunkCache, manifest: Manifest) -> None:
    """Keep ``manifest`` beside its chunks in ``cache`` and note it as the version last read online, so the
    dataset can be reopened offline. Called when a process first reads an online remote dataset through the
    cache; never fails a read (a cache that cannot be written only loses the offline copy, logged)."""
    location = cache.location
    if not isinstance(location, RemoteLocation) or location.offline:
        return
    directory, url = str(cache.config.directory), location.url
    try:
        os.makedirs(cache.root, exist_ok=True)
        copy, doc = os.path.join(cache.root, MANIFEST_COPY), json.dumps(manifest.to_json()).encode()
        if _read(copy) != doc:  # the same version can gain outputs (graphstore.outputs), which the digest leaves out
            write_atomic(copy, doc)
        note = {"url": url, "digest": os.path.basename(cache.root),
                "online_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_atomic(os.path.join(directory, url_dir(url), LATEST), json.dumps(note).encode())
    except (OSError, TypeError, ValueError) as exc:
        logger.info("%s: cannot keep its manifest in the cache %s (%s); it will not reopen offline", url, directory,
                    exc)


def load(directory: str, url: str) -> tuple[Manifest, str] | None:
    """The manifest :func:`remember` kept of ``url`` in ``directory`` and when (``2025-06-02 09:14:05 UTC``);
    ``None`` if there is none, or it does not check out (unreadable, another URL, not the version it names)."""
    try:
        note = json.loads(_read(os.path.join(directory, url_dir(url), LATEST)) or b"null")
        if not isinstance(note, dict) or note.get("url") != url:
            return None
        raw = _read(os.path.join(directory, dataset_dir(url, str(note["digest"])), MANIFEST_COPY))
        if raw is None:
            return None
        manifest = Manifest.from_json(json.loads(raw), url)
        if version_digest(manifest) != note["digest"]:
            return None
        return manifest, str(note["online_at"]).replace("T", " ").removesuffix("Z") + " UTC"
    except (OSError, ValueError, KeyError, TypeError, GraphstoreError) as exc:
        logger.info("%s: its copy in the cache %s is unusable (%s)", url, directory, exc)
        return None


def _online(location: Location, answer: tuple[bytes, Any]) -> Opened:
    raw, doc = answer
    return Opened(location, raw, Manifest.from_json(doc, location.url))


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
