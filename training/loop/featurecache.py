"""Features larger than memory: a rank's own feature rows read through a RAM cache and parallel disk reads.

With ``--feature-cache SIZE`` (or by itself when a rank's own feature rows are larger than half the
memory it may use: its cgroup's limit, else the host's memory, over its local ranks), each own
partition's node features ``x`` are served by :class:`~graphstore.storage.directrows.DirectRows` (direct
I/O: no page cache, so a memory limit holds the rank's working set and its cache, not the dataset; the
page-cache :class:`~graphstore.storage.diskrows.DiskRows` where the file system refuses direct I/O): the
rows most often a neighbour of the partition's nodes stay in RAM up to SIZE, and the others are read
per batch by sorted, coalesced, parallel reads. Each epoch reports the rows gathered, the cache's hits,
the bytes read from disk and the seconds spent, summed over ranks.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable

import numpy as np

from graphstore import heap
from graphstore.dataset import layout
from graphstore.errors import InvalidInputError

logger = logging.getLogger("graphstore")

ATTR = "x"
AUTO_SHARE = 0.5  # read through the disk path by itself when own features exceed this share of memory
# a batch's peak memory over the bytes of its feature rows (check_room): what the model adds to its inputs
# (a GraphSAGE layer keeps each edge's gathered row, the aggregates and its outputs for the backward pass),
# taken from the bench_beyond_ram job with a margin; a model whose activations outgrow its inputs needs more
PEAK_SHARE = 1.4
# the automatic RAM cache (fill_what_is_left) leaves this share of the rank's memory unused: the heap's slack
# and the page cache through which the topology and the model's files are read
LEFT_SHARE = 0.1
MIN_CACHE = 16 << 20  # a smaller automatic cache is not kept
# a sampler process's batches (check_room), per batch in flight (sampling.loader.sampler_processes.SLOTS of them):
# its block of shared memory, a quarter larger than the batch (sampling.loader.handoff.wanted_block), and the
# rank's copy once built
WORKER_BATCHES_PER_SLOT = 2.25
# a sampler process's own memory beside its batches: forked from its rank, it shares the rank's pages and the RAM
# cache; its private pages (/proc/PID/smaps_rollup) were 55 MB on the 150k-node graph of test_feature_cache
WORKER_BYTES = 64 << 20
# one not forked at the rank's start (a session's loader beyond Session(loader_workers=N)'s, or
# GRAPHSTORE_FORK_RANKS=0): an interpreter that imported torch, PyG and the loaders, 299 MB anonymous on this VM
# (/proc/self/smaps_rollup); from the fork server its pages are shared, so this is the bound
LATE_WORKER_BYTES = 320 << 20


def memory_limit(local_ranks: int) -> int:
    """Bytes this rank may use: its share of its cgroup's memory limit (v1 or v2) when one is set, else of
    the host's memory, shared by its local ranks (a launcher's ranks are in its cgroup, and so are the
    processes of a SLURM job step or a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min([total, *(limit for _, limit in _cgroup_limits())]) // max(local_ranks, 1)


def _cgroup_limits() -> list[tuple[str, int]]:
    """``(folder, limit)`` of each memory cgroup of this process that sets a limit."""
    out = []
    for path in _cgroup_limit_files():
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            out.append((os.path.dirname(path), int(text)))
    return out


def cgroup_memory() -> tuple[int, int] | None:
    """``(limit, anonymous bytes in use)`` of this process's memory cgroup (v1 or v2) where it sets a limit:
    every process of the group counts (the launcher and the other local ranks), page cache not (the kernel
    reclaims it before it kills)."""
    for folder, limit in _cgroup_limits():
        try:
            with open(os.path.join(folder, "memory.stat")) as fh:
                stat = dict(line.split()[:2] for line in fh if line.strip())
        except (OSError, ValueError):
            continue
        anon = stat.get("total_rss", stat.get("anon"))  # v1 counts the group's hierarchy as total_rss; v2: anon
        if anon is not None and anon.isdigit():
            return limit, int(anon)
    return None


def batch_rows_bound(seeds: int, fanout: tuple[int, ...], edge_rows: bool = True) -> int | None:
    """The most feature rows one batch holds at its peak (``None`` when a hop takes every neighbour): a row
    per sampled node (the ``seeds``, then each hop's draws) and, with ``edge_rows``, one per sampled edge,
    which PyG's message passing gathers from the edge's source before it aggregates; without (a model that
    aggregates by a sparse product, :mod:`training.loop.models`), a row per node of the first layer's
    destinations (every hop but the last), its aggregate."""
    nodes = batch_nodes_bound(seeds, fanout)
    if nodes is None:
        return None
    if not edge_rows:
        frontier = seeds * math.prod(fanout)
        return nodes + (nodes - frontier)
    return nodes + (nodes - seeds)  # a tree: an edge per node below the seeds


def batch_nodes_bound(seeds: int, fanout: tuple[int, ...]) -> int | None:
    """The most sampled nodes of one batch (a feature row each; ``None`` when a hop takes every neighbour)."""
    if any(k < 0 for k in fanout):
        return None
    nodes, frontier = seeds, seeds
    for k in fanout:
        frontier *= k
        nodes += frontier
    return nodes


def check_room(seeds: int, fanout: tuple[int, ...], row_bytes: int, local_ranks: int, flags: str,
               smaller: str = "--batch-size or --fanout", edge_rows: bool = True, workers: int = 0) -> int:
    """Refuse, in one line naming the memory it needs, a job whose memory cgroup cannot hold what it holds
    now and the batches its ranks build (:func:`batch_rows_bound` rows each, ``PEAK_SHARE`` more for the
    model's own tensors and the allocator), and what its ``workers`` sampler processes a rank hold
    (:func:`worker_bytes`): the OOM killer would end it mid-epoch. Nothing is refused without
    a cgroup limit or with a fanout of -1 (no bound). ``flags`` names the batch's shape, ``smaller`` what
    to make smaller, ``edge_rows`` whether the model gathers a feature row per edge (:func:`batch_rows_bound`).

    Returns the feature rows each rank may gather ahead of its training step (its loaders'
    ``prefetch_rows``): what the limit leaves beside that (without a cgroup limit: the host's available
    memory beside the batches); 0 with a fanout of -1."""
    group = cgroup_memory()
    rows = batch_rows_bound(seeds, fanout, edge_rows)
    if rows is None:
        return 0
    ranks = max(local_ranks, 1)
    if workers:  # those not forked at the rank's start come from a fresh interpreter (or the fork server)
        from sampling.loader.sampler_processes import idle

        held = worker_bytes(workers, seeds, fanout, row_bytes, late=max(0, workers - idle()))
    else:
        held = 0
    batch = (int(rows * row_bytes * PEAK_SHARE) + held) * ranks

    def ahead_of(free: int) -> int:  # each rank's share of what is left beside the batches, in rows
        return max(0, (free - batch) // ranks // max(row_bytes, 1))

    if group is None:
        from sampling.warmup.runner import available_memory  # MemAvailable

        available = available_memory()
        return ahead_of(available) if available is not None else 0
    limit, in_use = group
    ahead = ahead_of(limit - in_use)
    logger.info("memory: limit %.3f GB, %.3f GB in use, batches up to %.3f GB (%d rows of %d bytes); up to %d rows "
                "gathered ahead of the step", limit / 1e9, in_use / 1e9, batch / 1e9, rows, row_bytes, ahead)
    if in_use + batch > limit:
        raise InvalidInputError(
            f"memory: this job needs about {(in_use + batch) / 1e9:.2f} GB and its memory limit (cgroup) is "
            f"{limit / 1e9:.2f} GB: {in_use / 1e9:.2f} GB in use before training and {batch / 1e9:.2f} GB for the "
            f"batches of {ranks} rank(s) ({flags}: up to {rows:,} feature rows of {row_bytes:,} bytes "
            f"each, a row per sampled node{' and edge' if edge_rows else ' and per aggregate'}"
            f"{_held_text(workers, held)}); give it more memory, or a smaller {smaller}"
            f"{', or fewer sampler processes' if workers else ''}")
    return ahead


def worker_bytes(workers: int, seeds: int, fanout: tuple[int, ...], row_bytes: int, late: int = 0) -> int:
    """What ``workers`` sampler processes beside a rank hold at most: per process ``SLOTS`` batches in flight of
    :func:`batch_nodes_bound` feature rows, ``WORKER_BATCHES_PER_SLOT`` each (a block of shared memory a
    quarter larger than the batch and, once built, the rank's copy), and the process itself: ``WORKER_BYTES``
    forked at the rank's start, ``LATE_WORKER_BYTES`` for each of the ``late`` ones that were not."""
    from sampling.loader.sampler_processes import SLOTS

    nodes = batch_nodes_bound(seeds, fanout)
    if not workers or nodes is None:
        return 0
    per_worker = int(SLOTS * WORKER_BATCHES_PER_SLOT * nodes * row_bytes) + WORKER_BYTES
    return workers * per_worker + late * LATE_WORKER_BYTES


def _held_text(workers: int, held: int) -> str:
    return f", and {held / 1e9:.2f} GB a rank for {workers} sampler process(es) and their batches" if workers else ""


def fill_what_is_left(features: FeatureReader, ahead: int, seeds: int, fanout: tuple[int, ...], local_ranks: int,
                      batches_ahead: int, shared: bool = False) -> int:
    """Size an automatic reader's RAM cache (``feature_cache`` left out) once the batches' room is known: the
    hottest rows in what the memory leaves beside the batches in training (``ahead``: the rows each rank
    may gather ahead, from :func:`check_room`), ``batches_ahead`` batches gathered ahead of the step (up to
    :func:`batch_nodes_bound` rows each) and ``LEFT_SHARE`` of the memory unused; at most ``AUTO_SHARE`` of
    the rank's memory, and none under ``MIN_CACHE``; in shared memory with ``shared`` (the rank's sampler
    processes read it too). Returns the rows left to gather ahead (``ahead`` less the cache and the margin,
    where a cache was filled). Once per reader; a reader given its size (``--feature-cache``) keeps it."""
    nodes = batch_nodes_bound(seeds, fanout)
    if not features.automatic or features.filled or nodes is None or not features.readers:
        return ahead
    features.filled = True
    share = memory_limit(local_ranks)  # this rank's share of the limit (or of the host's memory)
    row = max(features.row_bytes, 1)
    margin = int(LEFT_SHARE * share)
    spare = (ahead - batches_ahead * nodes) * row - margin
    size = min(spare, int(AUTO_SHARE * share), features.own_bytes)
    if size < MIN_CACHE:
        logger.info("features: no RAM cache: the memory left beside the batches (%.3f GB) is under %d MB",
                    max(spare, 0) / 1e9, MIN_CACHE >> 20)
        return ahead
    features.fill(size, shared)
    beside = ("the sampler processes' batches" + (", in shared memory" if features.in_shared_memory() else "")
              if shared else f"{batches_ahead} gathered ahead")
    logger.warning("features: the hottest rows of x in RAM, %.2f GB: what the memory leaves beside the batch in "
                   "training and %s (--feature-cache SIZE sets it, 0 keeps none)", features.cache_bytes / 1e9, beside)
    return max(0, ahead - features.cache_bytes // row - margin // row)  # the margin is no batch's either


def _cgroup_limit_files() -> list[str]:
    out = []
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":  # cgroup v2
                    out.append(f"/sys/fs/cgroup{path}/memory.max")
                elif "memory" in controllers.split(","):
                    out.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    except OSError:
        pass
    return out


def hottest(dataset: Any, part: int, node_type: Any, capacity: int) -> np.ndarray:
    """Up to ``capacity`` own rows (local row numbers) of ``part`` most often the source of an edge into
    it: the neighbours its seeds draw first."""
    from sampling.loader.gpu_cache import edge_source_counts

    info = dataset.manifest.node_type(node_type) if node_type is not None else dataset.manifest.node_types[0]
    lo, hi = int(info.offsets[part]), int(info.offsets[part + 1])
    if capacity <= 0:
        return np.zeros(0, np.int64)
    counts = edge_source_counts(dataset, (part,), info)[lo:hi]
    order = np.argsort(-counts, kind="stable")[:capacity]
    return np.sort(order[counts[order] > 0])


class FeatureReader:
    """The rank's :class:`DiskRows`, one per own partition (and node type with ``x``), and their counts."""

    def __init__(self, readers: list[Any], cache_bytes: int, automatic: bool, short: bool = False,
                 row_bytes: int = 0, hot_sets: list[Callable[[int], np.ndarray]] | None = None) -> None:
        self.readers, self.cache_bytes, self.automatic = readers, cache_bytes, automatic
        self.short = short  # own features exceed AUTO_SHARE of memory: batches ahead bounded by the memory left
        self.row_bytes = row_bytes  # the widest row of x
        self.hot_sets = hot_sets or []  # per reader: its hottest rows up to a byte budget (fill)
        self.filled = False  # an automatic reader's cache, sized once the batches' room is known (fill_what_is_left)

    @property
    def own_bytes(self) -> int:
        """The bytes of the rows these readers serve."""
        return sum(len(r) * r.row_bytes for r in self.readers)

    def in_shared_memory(self) -> bool:
        """Whether its RAM caches lie in shared memory (where the rank's sampler processes read them)."""
        return any(r.cache is not None and r.cache.is_shared() for r in self.readers)

    def fill(self, size: int, shared: bool = False) -> None:
        """Keep the hottest rows in RAM up to ``size`` bytes, split over the readers by their rows (each
        partition's own hottest), in place of the cache kept before; in shared memory with ``shared`` (for
        sampler processes). Loaders gathering meanwhile get the stored rows, from disk while a cache fills."""
        total = max(sum(len(r) for r in self.readers), 1)
        for reader, hot_set in zip(self.readers, self.hot_sets):
            reader.keep_hot(hot_set(size * len(reader) // total), shared)
        self.cache_bytes = sum(r.cache_bytes for r in self.readers)

    @classmethod
    def install(cls, dataset: Any, parts: list[int], size: int | None, local_ranks: int,
                shared: bool = False) -> FeatureReader | None:
        """Read ``x`` of ``parts`` through :class:`DiskRows` with a RAM cache of ``size`` bytes (split over
        the partitions by their rows; in shared memory with ``shared``: for sampler processes); with ``size``
        ``None``, only when own ``x`` exceeds half of this rank's memory (no cache then). ``None`` when nothing
        was installed."""
        types = [n for n in dataset.manifest.node_types if ATTR in n.attrs]
        own = [(n, p) for n in types for p in parts]
        own_bytes = sum(_attr_bytes(n) * int(n.offsets[p + 1] - n.offsets[p]) for n, p in own)
        limit = memory_limit(local_ranks)
        if size is None and own_bytes <= AUTO_SHARE * limit:
            return None
        total_rows = max(sum(int(n.offsets[p + 1] - n.offsets[p]) for n, p in own), 1)
        readers, hot_sets = [], []
        for n, p in own:
            rows = int(n.offsets[p + 1] - n.offsets[p])
            name = n.name if dataset.is_hetero else None

            def hot_set(budget: int, p: int = p, name: Any = name, row_bytes: int = _attr_bytes(n)) -> np.ndarray:
                return hottest(dataset, p, name, budget // max(row_bytes, 1))

            hot = hot_set((size or 0) * rows // total_rows)
            where = f"{dataset.url} partition {p} " + (f"{n.name}.{ATTR}" if n.name is not None else ATTR)
            path = layout.node_array(p, n.key, ATTR)
            got = dataset.read_through(path, lambda r, h=None if shared else hot, w=where, a=path:
                                       _reader(dataset, a, r, h, w))
            if got is not None and shared:
                got.keep_hot(hot, shared)
            if got is not None:
                readers.append(got)
                hot_sets.append(hot_set)
        if not readers:
            return None
        reader = cls(readers, sum(r.cache_bytes for r in readers), automatic=size is None,
                     short=own_bytes > AUTO_SHARE * limit, row_bytes=max(_attr_bytes(n) for n in types),
                     hot_sets=hot_sets)
        if own_bytes > AUTO_SHARE * limit:  # short of memory: what a batch frees goes back, not kept for the next
            heap.return_freed_promptly()
        if size is None:
            logger.warning("features: this rank's own x (%.2f GB) exceeds half of its memory (%.2f GB): reading it "
                           "from disk by parallel reads; --feature-cache SIZE keeps its hottest rows in RAM (left "
                           "out: once the batches are counted, in what the memory leaves)", own_bytes / 1e9,
                           limit / 1e9)
        return reader

    def snapshot(self, reset: bool = True) -> dict[str, Any]:
        out = {"rows": 0, "hits": 0, "disk_bytes": 0, "read_seconds": 0.0}
        for r in self.readers:
            for key, value in r.snapshot(reset).items():
                out[key] += value
        return out

    def epoch_record(self, group: Any = None) -> dict[str, Any]:
        """This epoch's counts summed over ranks (a collective: every rank calls it), this rank's cache size
        (``cache_bytes``), and the caches of all ranks with a disk tier (``cache_bytes_all``, over ``ranks``)."""
        snap = self.snapshot(reset=True)
        keys = ("rows", "hits", "disk_bytes", "read_seconds")
        import torch
        import torch.distributed as dist

        counts = torch.tensor([float(snap[k]) for k in keys] + [float(self.cache_bytes), float(bool(self.readers))],
                              dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(counts, group=group)
        out = {k: (round(float(v), 3) if k == "read_seconds" else int(v)) for k, v in zip(keys, counts)}
        return {**out, "cache_bytes": self.cache_bytes, "cache_bytes_all": int(counts[4]), "ranks": int(counts[5])}


def _reader(dataset: Any, path: str, rows: Any, hot: np.ndarray, where: str) -> Any:
    """Rows of ``path`` read with direct I/O (no page cache: :mod:`graphstore.storage.directrows`) where the
    dataset is local and uncompressed and its file system allows it, else through the page cache, said in one
    line: by the mapping (:class:`~graphstore.storage.diskrows.DiskRows`), or for a partition read unmapped
    (``rows`` a :class:`~graphstore.storage.fileio.FileRows`) by the same parallel reads without ``O_DIRECT``."""
    from graphstore.storage.directrows import direct_rows
    from graphstore.storage.diskrows import DiskRows

    info = dataset.manifest.arrays.get(path)
    if dataset.location.is_local and info is not None and info.compression == "none":
        reader = direct_rows(dataset.chunk_files(path), rows, hot, where)
        if reader is not None:
            return reader
        logger.warning("features: the file system of %s refuses direct I/O (O_DIRECT): reading its rows through "
                       "the page cache, whose pages count against a memory limit", where)
    if isinstance(rows, np.ndarray):
        return DiskRows(rows, hot, where)
    return direct_rows(dataset.chunk_files(path), rows, hot, where, direct=False)  # unmapped: local, uncompressed


def _attr_bytes(node_type: Any) -> int:
    schema = node_type.attrs[ATTR]
    return int(np.dtype(schema.dtype).itemsize * int(np.prod(schema.shape or (1,))))


def text(record: dict[str, Any]) -> str:
    """``  features: 1.23 GB from disk in 4.5 s, RAM cache 0.27 GB, hits 41.0%`` (training batches, all ranks;
    the cache this rank's alone, or ``RAM caches 0.54 GB over 2 ranks``), or nothing."""
    got = record.get("features")
    if not got:
        return ""
    size, ranks = got.get("cache_bytes") or 0, got.get("ranks") or 1
    if ranks > 1:
        size = got.get("cache_bytes_all") or 0
    kept = (f"{size / 1e9:.2f} GB" if size >= 100_000_000 else f"{size / 1e6:.1f} MB" if size >= 100_000 else
            f"{size / 1e3:.0f} KB")
    caches = f"RAM caches {kept} over {ranks} ranks" if ranks > 1 else f"RAM cache {kept}"
    hits = f", {caches}, hits {100 * got['hits'] / max(got['rows'], 1):.1f}%" if size else ""
    return f"  features: {got['disk_bytes'] / 1e9:.2f} GB from disk in {got['read_seconds']:.1f} s{hits}"
