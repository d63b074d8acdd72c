"""An opened dataset: its manifest, the range partition book, its arrays, and its partitions' stores."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from graphstore.dataset import layout
from graphstore.storage.arrays import ZarrRows, open_array, open_chunk_files
from graphstore.storage.fileio import ChunkFiles, FileRows
from graphstore.storage import offline
from graphstore.storage.cache import CacheConfig, ChunkCache, ChunkRef, version_digest
from graphstore.errors import (CorruptDatasetError, DatasetNotFoundError, GraphstoreError, InvalidInputError,
                               PartitionIndexError, UnknownAttributeError)
from graphstore.storage.integrity import (Read, check_csc, chunk_file_problems, manifest_problems, metadata_key,
                                  metadata_paths, storage_problems, verify_chunks)
from graphstore.storage.iostats import IOStats
from graphstore.storage.lazy import LazyRows
from graphstore.dataset.manifest import Manifest
from graphstore.dataset.trainable import trainable_problems
from graphstore.storage.retry import RetryPolicy
from graphstore.storage.local import Location, open_location
from graphstore.dataset.types import EdgeType, NodeType

if TYPE_CHECKING:  # the stores import PyG (seconds): opened when a partition is served, not to read a manifest
    from graphstore.dataset.stores import ZarrFeatureStore, ZarrGraphStore

Progress = Callable[[int, int], None]
_TOPOLOGY = layout.TOPOLOGY | {layout.HALO_IDS}

logger = logging.getLogger(__name__)


class Dataset:
    """A graphstore dataset opened read-only. Arrays are mapped on first use; the object pickles.

    Local (and NFS) datasets map their chunk files in place. Remote ones read through a local chunk
    cache (:class:`~graphstore.storage.cache.CacheConfig`): a chunk is downloaded the first time a read needs
    it, verified, and mapped like a local one. :meth:`io_stats` counts what this process fetched.

    Examples
    --------
    >>> ds = open_dataset("/data/cora")  # doctest: +SKIP
    >>> feature_store, graph_store = ds.partition(0)  # doctest: +SKIP
    >>> feature_store[None, "x", None].shape  # doctest: +SKIP
    torch.Size([1354, 1433])
    """

    def __init__(self, location: Location, manifest: Manifest, cache: CacheConfig | None = None,
                 verify_reads: bool = False) -> None:
        self.location = location
        self.manifest = manifest
        self.cache_config = cache if cache is not None else CacheConfig()
        self.verify_reads = bool(verify_reads)
        self._checked: set[tuple[int, str]] = set()  # (partition, edge type key) whose topology passed
        self._arrays: dict[str, np.ndarray | ZarrRows | LazyRows] = {}
        self.unmapped_parts: frozenset[int] = frozenset()  # read with pread, never mapped: read_unmapped
        self._unmapped_paths: set[str] = set()
        self._stats = IOStats()
        self._cache: ChunkCache | None = None

    def __repr__(self) -> str:
        return f"Dataset({self.url!r}, name={self.name!r}, num_parts={self.num_parts})"

    def __getstate__(self) -> dict[str, Any]:
        # mapped arrays, the cache's threads and the counters stay in this process; reopened lazily
        return {"location": self.location, "manifest": self.manifest, "cache": self.cache_config,
                "verify_reads": self.verify_reads, "unmapped_parts": sorted(self.unmapped_parts)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"], state["manifest"], state.get("cache"),  # type: ignore[misc]
                      state.get("verify_reads", False))
        if state.get("unmapped_parts"):
            self.read_unmapped(state["unmapped_parts"])

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def num_parts(self) -> int:
        return self.manifest.num_parts

    @property
    def is_hetero(self) -> bool:
        return self.manifest.is_hetero

    @property
    def node_types(self) -> list[NodeType]:
        return [t.name for t in self.manifest.node_types]

    @property
    def edge_types(self) -> list[EdgeType]:
        return [t.name for t in self.manifest.edge_types]

    @property
    def metadata(self) -> dict[str, Any]:
        """The manifest as JSON, without the per-array table."""
        doc = self.manifest.to_json()
        doc.pop("arrays")
        return doc

    def num_nodes(self, ntype: NodeType = None) -> int:
        return self.manifest.node_type(ntype).num_nodes

    def node_offsets(self, ntype: NodeType = None) -> np.ndarray:
        """The range partition book: partition p owns global IDs ``[offsets[p], offsets[p+1])``."""
        return np.asarray(self.manifest.node_type(ntype).offsets, dtype=np.int64)

    def owner(self, ids: Any, ntype: NodeType = None) -> np.ndarray:
        """The partition owning each global node ID."""
        return np.searchsorted(self.node_offsets(ntype), np.asarray(ids), side="right") - 1

    def check_part(self, part: int) -> int:
        if not isinstance(part, (int, np.integer)) or isinstance(part, bool) or not 0 <= part < self.num_parts:
            raise PartitionIndexError(
                f"partition {part!r} is out of range: {self.url} has {self.num_parts} partitions "
                f"(0..{self.num_parts - 1})"
            )
        return int(part)

    def array(self, path: str) -> np.ndarray | ZarrRows | LazyRows:
        """A stored array by its layout path, opened once per process.

        Local: an ``np.ndarray`` over the mapped chunk files. Remote: a :class:`LazyRows` whose reads
        fetch the chunks they need, replaced by the plain ``np.ndarray`` once every chunk is here.
        """
        found = self._arrays.get(path)
        if found is None:
            info = self.manifest.arrays.get(path)
            if info is None:
                raise CorruptDatasetError(f"{self.url}: array {path} is not in the manifest; re-ingest the dataset")
            cache = None if self.location.is_local else self.chunk_cache()
            if self.verify_reads and self.location.is_local:  # remote chunks are checked as they arrive
                verify_chunks(self.location, path, info)
            if path in self._unmapped_paths:
                found = self._arrays[path] = FileRows(open_chunk_files(self.location, path, info))
            else:
                found = self._arrays[path] = open_array(self.location, path, info, cache)
        elif type(found) is LazyRows and found.complete:
            found = self._arrays[path] = found.full  # every chunk mapped: reads skip the wrapper from now on
        return found

    def read_unmapped(self, parts: Iterable[int]) -> None:
        """From now on, in this process (and in copies pickled from it), read partitions ``parts`` without
        mapping them: their node and edge arrays (features, labels, input IDs, edge attributes) as
        :class:`~graphstore.storage.fileio.FileRows`, and their topology, by the samplers built after this
        call, with ``pread`` too (:func:`sampling.graph.topology.from_dataset`). What such a partition's reads touch
        then stays out of this process's resident set: its memory does not grow with the partition. Each read
        is a system call. Needs a local, uncompressed dataset; raises :class:`InvalidInputError` otherwise."""
        parts = sorted({int(p) for p in parts})
        bad = [p for p in parts if not 0 <= p < self.num_parts]
        if bad:
            raise PartitionIndexError(f"{self.url}: partitions {bad} do not exist (0..{self.num_parts - 1})")
        if parts and (not self.location.is_local or any(a.compression != "none" for a in self.manifest.arrays.values())):
            what = "remote" if not self.location.is_local else "compressed"
            raise InvalidInputError(f"{self.url}: the dataset is {what}; reading it without mapping needs a local, "
                                    "uncompressed dataset: copy it to local disk (or re-ingest without compression), "
                                    "or leave it mapped")
        self.unmapped_parts = self.unmapped_parts | frozenset(parts)
        for part in parts:
            for node_type in self.manifest.node_types:
                self._unmapped_paths.update(layout.node_array(part, node_type.key, attr)
                                            for attr in [*node_type.attrs, layout.ORIG_ID])
            for edge_type in self.manifest.edge_types:  # edge attributes (the topology: the samplers')
                self._unmapped_paths.update(layout.edge_array(part, edge_type.key, attr) for attr in edge_type.attrs
                                            if attr not in layout.TOPOLOGY)
        self._unmapped_paths &= set(self.manifest.arrays)
        for path in self._unmapped_paths:
            if isinstance(self._arrays.get(path), np.ndarray):
                del self._arrays[path]  # reopened unmapped by the next read

    def chunk_files(self, path: str) -> ChunkFiles:
        """Array ``path``'s chunk files open for ``pread`` (a local, uncompressed dataset)."""
        info = self.manifest.arrays.get(path)
        if info is None:
            raise CorruptDatasetError(f"{self.url}: array {path} is not in the manifest; re-ingest the dataset")
        return open_chunk_files(self.location, path, info)

    def read_through(self, path: str, wrap: Callable[[np.ndarray], Any]) -> Any:
        """Serve array ``path`` as ``wrap(rows)`` from now on, in this process (e.g. a
        :class:`~graphstore.storage.diskrows.DiskRows`: a RAM cache and parallel disk reads for features
        larger than memory); returns the wrapper. Every store of the dataset reads through it. ``None``
        (nothing changes) for a remote array whose chunks are still arriving: the chunk cache serves it. ``rows``
        is the mapped array, or the :class:`~graphstore.storage.fileio.FileRows` of a partition read unmapped."""
        rows = self.array(path)
        if not isinstance(rows, (np.ndarray, FileRows)):
            return None
        found = self._arrays[path] = wrap(rows)
        return found

    def shared_readers(self) -> dict[str, Any]:
        """The arrays this process reads through a row reader (:meth:`read_through`), as a sampler process of
        this rank rebuilds them (:meth:`read_shared`): ``{path: SharedReader}``, their RAM caches in shared
        memory (:meth:`~graphstore.storage.diskrows.RowReader.shared`)."""
        from graphstore.storage.diskrows import RowReader

        return {path: found.shared() for path, found in self._arrays.items() if isinstance(found, RowReader)}

    def read_shared(self, shared: dict[str, Any]) -> None:
        """Read the arrays of ``shared`` (:meth:`shared_readers` of another process) as that process does, in
        this one: the same kind of reads, the hot rows from the same cache."""
        from graphstore.storage.directrows import reopen

        for path, recipe in shared.items():
            self.read_through(path, lambda rows, r=recipe, p=path: reopen(r, self.chunk_files(p), rows))

    def reader_counts(self, reset: bool = True) -> dict[str, dict[str, Any]]:
        """``{path: counts}`` of the row readers of this process (rows, hits, disk bytes, seconds) since the
        last reset, the ones that gathered anything."""
        from graphstore.storage.diskrows import RowReader

        out = {}
        for path, found in self._arrays.items():
            if isinstance(found, RowReader):
                counts = found.snapshot(reset)
                if counts["rows"]:
                    out[path] = counts
        return out

    def add_reader_counts(self, counts: dict[str, dict[str, Any]]) -> None:
        """Count what another process's readers of these arrays gathered (:meth:`reader_counts`) as this
        process's readers' own."""
        from graphstore.storage.diskrows import RowReader

        for path, got in counts.items():
            found = self._arrays.get(path)
            if isinstance(found, RowReader):
                found.counts.add_counted(got["rows"], got["hits"], got["disk_bytes"], got["read_seconds"])

    def topology(self, part: int, edge_type: EdgeType = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray | None]:
        """``(indptr, indices, eid, packed or None)`` of one partition and edge type, checked once per process
        (:meth:`check_topology`), mapped: a partition read unmapped (:meth:`read_unmapped`) is mapped for this
        caller, though its samplers read it with ``pread``."""
        self.check_topology(part, edge_type)
        arrays = {name: np.asarray(self.array(path)) for name, path in self._topology_paths(part, edge_type).items()}
        return arrays[layout.INDPTR], arrays[layout.INDICES], arrays[layout.EID], arrays.get(layout.PACKED)

    def check_topology(self, part: int, edge_type: EdgeType = None) -> None:
        """Check one partition's topology of ``edge_type`` once per process, keeping no mapping of it.

        Local chunks are compared with their manifest checksums and the CSC invariants are checked
        (:func:`~graphstore.storage.integrity.check_csc`), so damaged topology is a :class:`CorruptDatasetError`
        naming the array and chunk, never a crash in a sampler.
        """
        info = self.manifest.edge_type(edge_type)
        if (part, info.key) in self._checked:
            return
        paths = self._topology_paths(part, edge_type)
        local = self.location.is_local
        if local:
            for path in paths.values():
                verify_chunks(self.location, path, self.manifest.arrays[path])
        src = next(t for t in self.manifest.node_types if t.key == info.src)
        # Local uncompressed arrays are checked through mappings of their own, unmapped after. The check reads
        # every page once; through the served arrays those pages would stay in this process's resident set for
        # good, though a sampler over the packed pairs never reads indices and eid again (1.8 of a rank's 3.3 GB
        # of mapped pages at 12M nodes), and a partition read unmapped would stay mapped. What the check read
        # stays in the page cache, the kernel's.
        own = {name: np.asarray(open_array(self.location, path, self.manifest.arrays[path]))
               if local and self.manifest.arrays[path].compression == "none" else np.asarray(self.array(path))
               for name, path in paths.items()}
        check_csc(f"{self.url}/{layout.edge_array(part, info.key, '')}".rstrip("/"), own[layout.INDPTR],
                  own[layout.INDICES], own[layout.EID], own.get(layout.PACKED), src.num_nodes,
                  info.num_edges, {n: self.manifest.arrays[p].chunk_rows for n, p in paths.items()})
        del own
        self._checked.add((part, info.key))

    def _topology_paths(self, part: int, edge_type: EdgeType) -> dict[str, str]:
        """``{name: layout path}`` of the topology arrays the dataset stores for ``part`` and ``edge_type``."""
        key = self.manifest.edge_type(edge_type).key
        paths = {name: layout.edge_array(part, key, name) for name in layout.TOPOLOGY}
        return {name: path for name, path in paths.items() if path in self.manifest.arrays}

    def check_chunk_files(self) -> None:
        """Raise :class:`CorruptDatasetError` if a local chunk file is missing or short (``os.stat`` only)."""
        if not self.location.is_local:
            return
        problems = chunk_file_problems(self.location, self.manifest.arrays)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CorruptDatasetError(f"{self.url}: {problems[0]}{more}; run `graphstore verify {self.url}` and "
                                      "re-ingest the dataset")

    def check_structure(self) -> None:
        """The cheap check every open makes: raise :class:`CorruptDatasetError` naming what is wrong.

        The manifest must agree with itself (no I/O). Local datasets also need every partition, group
        and array the manifest lists, each array's Zarr metadata parsing and matching its manifest entry
        (shape, dtype, chunking, codec), and every chunk file present and whole (``os.stat`` only). Remote
        ones get no request beyond the manifest: :meth:`verify` checks their metadata and chunks.
        """
        problems = manifest_problems(self.manifest)
        if self.location.is_local and not problems:
            problems, gone = storage_problems(self.manifest, self.location.read_bytes, self.location.has)
            arrays = {p: a for p, a in self.manifest.arrays.items() if p not in gone}
            problems += chunk_file_problems(self.location, arrays)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CorruptDatasetError(f"{self.url}: {problems[0]}{more}; the dataset is damaged: run `graphstore "
                                      f"verify {self.url}` to list every problem, then re-ingest with --overwrite")

    def chunk_cache(self) -> ChunkCache:
        """This process's cache of this (remote) dataset's chunks."""
        if self._cache is None:
            self._cache = ChunkCache(self.location, version_digest(self.manifest), self.cache_config, self._stats)
            offline.remember(self._cache, self.manifest)  # so that it can be reopened offline
        return self._cache

    def io_stats(self) -> dict[str, Any]:
        """What this process fetched: ``requests``, ``bytes``, cache ``hits``/``misses``, ``retries``,
        ``wait_seconds``, totals and per array (``arrays``). Local datasets read in place: all zero."""
        return self._stats.snapshot()

    def reset_io_stats(self) -> None:
        self._stats.reset()

    def has_array(self, path: str) -> bool:
        return path in self.manifest.arrays

    def partition(self, part: int, prefetch: bool | str | Iterable[str] = False,
                  progress: Progress | None = None) -> tuple[ZarrFeatureStore, ZarrGraphStore]:
        """The PyG ``(FeatureStore, GraphStore)`` pair serving partition ``part``.

        ``prefetch`` (remote datasets): ``True`` pulls every array of the partition into the local cache
        now; attribute names (``["x", "y"]``) pull the topology and those attributes. ``progress(done,
        total)`` is called per chunk. Without it, chunks are fetched when a read first needs them.

        Examples
        --------
        >>> fs, gs = ds.partition(0, prefetch=["x"])  # doctest: +SKIP
        """
        from graphstore.dataset.stores import ZarrFeatureStore, ZarrGraphStore

        part = self.check_part(part)
        if prefetch is not False and prefetch is not None:
            self.prefetch(part, prefetch, progress)
        return ZarrFeatureStore(self, part), ZarrGraphStore(self, part)

    def prefetch(self, part: int, attrs: bool | str | Iterable[str] = True, progress: Progress | None = None) -> int:
        """Fetch partition ``part``'s arrays (all, or topology + ``attrs``) into the cache; return the chunk count."""
        part = self.check_part(part)
        if self.location.is_local:
            return 0
        lazy = {p: a for p in self._partition_paths(part, attrs) if isinstance(a := self.array(p), LazyRows)}
        refs = [ChunkRef(p, rows.info, i) for p, rows in lazy.items() for i in rows.missing()]
        self.chunk_cache().fetch_many(refs, lambda ref, fd: lazy[ref.path].install(ref, fd), progress)
        for rows in lazy.values():
            rows.ensure(None)  # whole-array (compressed) ones are decoded now, from the cache
        return len(refs)

    def _partition_paths(self, part: int, attrs: bool | str | Iterable[str]) -> list[str]:
        prefix = layout.part_key(part) + "/"
        paths = sorted(p for p in self.manifest.arrays if p.startswith(prefix))
        if attrs is True:
            return paths
        names = {attrs} if isinstance(attrs, str) else set(attrs)  # type: ignore[arg-type]
        known = {p.rsplit("/", 1)[1] for p in paths}
        if names - known:
            raise UnknownAttributeError(f"prefetch names {sorted(names - known)}, which partition {part} does not "
                                        f"store; it has {sorted(known)}")
        return [p for p in paths if p.rsplit("/", 1)[1] in names | _TOPOLOGY]

    def verify(self, progress: Progress | None = None) -> list[str]:
        """Check everything against the manifest; return one message per problem (empty: sound).

        Problems are the manifest contradicting itself, a partition, group or array that is missing, group
        or array metadata that does not parse or disagrees with the manifest (shape, dtype, chunking,
        codec), every chunk that is missing or fails its checksum (one line per missing array, not per
        chunk), and what the training door refuses in arrays whose chunks are sound
        (:func:`~graphstore.dataset.trainable.trainable_problems`: labels, training nodes, feature width,
        the CSC invariants of the topology). Remote datasets are read concurrently (every chunk is
        downloaded; counted in :meth:`io_stats`).
        """
        problems = manifest_problems(self.manifest)
        found_problems, gone = storage_problems(self.manifest, self._metadata_reader(), self._has)
        sound = not problems and not found_problems  # arrays readable as the manifest says
        problems += found_problems
        refs = [ChunkRef(path, info, i) for path, info in sorted(self.manifest.arrays.items()) if path not in gone
                for i in range(info.num_chunks)]
        if self.location.is_local:
            found: Iterable[str | None] = (self.location.checksum(ref.key) for ref in refs)
        else:
            found = self.chunk_cache().stored_checksums(refs)
        damaged = set(gone)
        for done, (ref, checksum) in enumerate(zip(refs, found), 1):
            expected = ref.info.checksums[ref.index]
            if checksum is None:
                problems.append(f"{ref.path}: chunk {ref.index} ({ref.key}) is missing")
            elif checksum != expected:
                problems.append(f"{ref.path}: chunk {ref.index} ({ref.key}) is corrupted (checksum {checksum}, "
                                f"expected {expected})")
            damaged.update([ref.path] if checksum != expected else [])
            if progress:
                progress(done, len(refs))
        if sound:  # what training reads, in arrays whose chunks are sound
            problems += trainable_problems(self, damaged)
        return problems

    def _metadata_reader(self) -> Read:
        """Local: read metadata when asked. Remote: every group and array metadata document, fetched now
        concurrently (one request each, counted in :meth:`io_stats` under its path)."""
        if self.location.is_local:
            return self.location.read_bytes
        paths = metadata_paths(self.manifest)
        with ThreadPoolExecutor(max(1, self.cache_config.concurrency)) as pool:
            docs = list(pool.map(lambda path: self.location.read_bytes(metadata_key(path)), paths))
        for path, raw in zip(paths, docs):
            self._stats.add(path, requests=1, nbytes=len(raw or b""))
        return dict(zip(map(metadata_key, paths), docs)).get

    def _has(self, path: str) -> bool:
        if not self.location.is_local:
            self._stats.add(path, requests=1)
        return self.location.has(path)


def open_dataset(url: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None, *,
                 cache_dir: str | os.PathLike[str] | None = None, cache_max_bytes: int | str | None = None,
                 concurrency: int = 16, retry: RetryPolicy | None = None, verify_reads: bool = False,
                 check: bool = True) -> Dataset:
    """Open the graphstore dataset at ``url``: a local/NFS path, ``file://``, or any fsspec URL (``s3://``, ...).

    Refuses a location without a complete manifest (an interrupted ingest) or with an unknown format
    version. For remote URLs, ``storage_options`` go to the fsspec file system (credentials there
    or, better, in the usual environment variables), chunks are cached under ``cache_dir`` (default
    ``$GRAPHSTORE_CACHE_DIR`` or ``~/.cache/graphstore``) up to ``cache_max_bytes`` (default
    ``$GRAPHSTORE_CACHE_MAX_BYTES`` or unbounded), fetched ``concurrency`` at a time, and transient
    errors are retried as ``retry`` says. Topology is always checked on first use (checksums of local
    chunks and CSC invariants); ``verify_reads=True`` also checks every other local array's chunk
    checksums when the array is first read (remote chunks are always checked as they arrive).

    Every open makes the cheap structure check (:meth:`Dataset.check_structure`: no chunk is read, and a
    remote open sends no request beyond the manifest) and raises :class:`CorruptDatasetError` naming the
    damage; ``check=False`` skips it (``graphstore verify`` does, to list every problem).

    A remote dataset opened before with this ``cache_dir`` reopens from the cache alone when its store
    cannot be connected to (one warning line says so and how old the copy is), or always with the storage
    option ``offline=True`` (``False``: never fall back). It is the version last read from the store; a read
    needing a chunk the cache lacks raises :class:`StorageError` naming the array
    (:mod:`graphstore.storage.offline`).

    Examples
    --------
    >>> import graphstore
    >>> ds = graphstore.open_dataset("/data/cora")  # doctest: +SKIP
    >>> ds = graphstore.open_dataset("s3://bucket/cora", cache_dir="/scratch/gs-cache")  # doctest: +SKIP
    >>> ds = graphstore.open_dataset("s3://bucket/cora", {"offline": True}, cache_dir="/scratch/gs")  # doctest: +SKIP
    >>> ds.num_parts  # doctest: +SKIP
    2
    """
    location = open_location(url, storage_options, retry=retry)
    cache = CacheConfig(directory=None if cache_dir is None else os.fspath(cache_dir), max_bytes=cache_max_bytes,
                        concurrency=concurrency)
    if location.is_local:
        opened = offline.Opened(location, b"", Manifest.from_json(_read_manifest(location)[1], location.url))
    else:  # a remote one can be served from the cache (graphstore.storage.offline)
        opened = offline.read_manifest(location, str(cache.directory), _read_manifest)
    dataset = Dataset(opened.location, opened.manifest, cache, verify_reads)
    if opened.offline:
        offline.announce(dataset.chunk_cache(), opened)
    elif not location.is_local:
        dataset._stats.add(layout.ROOT_METADATA, requests=1, nbytes=len(opened.raw))
    if check:
        dataset.check_structure()
    return dataset


def read_manifest(location: Location) -> Manifest:
    """The manifest stored at ``location`` now (read again, never cached); refuses a location without one."""
    return Manifest.from_json(_read_manifest(location)[1], location.url)


def _read_manifest(location: Location) -> tuple[bytes, Any]:
    """The root metadata's bytes and its manifest; refuses a location without a complete one."""
    try:
        raw = location.read_bytes(layout.ROOT_METADATA)
        doc = None if raw is None else json.loads(raw)
    except GraphstoreError:
        raise  # storage errors name the URL and the fix already
    except (ValueError, OSError) as exc:
        raise CorruptDatasetError(f"{location.url}/{layout.ROOT_METADATA} is unreadable ({exc}); re-ingest") from exc
    if doc is None:
        raise DatasetNotFoundError(
            f"no graphstore dataset at {location.url}: {layout.ROOT_METADATA} is missing; check the path, "
            "or create the dataset with `graphstore ingest SOURCE DEST`"
        )
    manifest = doc.get("attributes", {}).get(layout.MANIFEST_ATTR) if isinstance(doc, dict) else None
    if manifest is None:
        raise DatasetNotFoundError(
            f"{location.url} is not a complete graphstore dataset: it has no manifest (an ingest into it was "
            "interrupted, or it is another Zarr group); run the ingest again with --overwrite"
        )
    return raw or b"", manifest
