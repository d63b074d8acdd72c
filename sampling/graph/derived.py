"""Per-block arrays the engine derives from a block's stored ones, built once and then reused:
alias tables of the edge weights and each destination's edges sorted by time (its times, then its
sources and edge IDs).

Built at first use (one pass over the block, numba or numpy) and kept per process; for dataset blocks of 16 MiB
of sources or more also written to the dataset's cache directory (``<cache_dir>/derived``, keyed by the stored arrays'
checksums, atomic rename) and memory-mapped from there, so every process and every later run on the
machine shares one copy in page cache instead of building its own. Ingest is not involved. The stored
entries are kept within ``$GRAPHSTORE_DERIVED_MAX_BYTES`` (default 16 GiB) per cache directory, the least
recently used removed first (:func:`trim`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Callable

import numpy as np
from numba import njit

from graphstore.storage.mapped import advise_huge_pages
from sampling.graph.topology import in_huge_pages

logger = logging.getLogger(__name__)

STORE_MIN_BYTES = 1 << 24  # smaller sources are rebuilt by each process (a fraction of a second), never stored
ENV_MAX_BYTES = "GRAPHSTORE_DERIVED_MAX_BYTES"
DEFAULT_MAX_BYTES = 16 << 30  # stored derived arrays kept per cache directory; the least recently used go first
_STALE_SECONDS = 24 * 3600  # a writer's temporary file this old was left by a process that died mid-write
_BUILT: OrderedDict[tuple, tuple] = OrderedDict()  # (kind, id of each source array) -> (sources, result)
_KEEP = 64  # derived arrays kept per process (the least recently used go first)
_LOCK = threading.Lock()


@njit(cache=True, nogil=True)
def alias_table(indptr, weight):
    """Walker's alias table of each destination's edges (Vose's construction), 8 bytes per CSC position
    ``p`` (uint32): ``out[2p]`` the threshold below which 32 uniform bits keep column ``p`` (0: a
    non-positive or NaN weight, never kept; a kept column's threshold is at least 1), ``out[2p + 1]``
    the offset (within the destination's edges) of its alias, which a column that is always kept
    aliases to itself. A destination without a positive weight has ``out[2 * start + 1] = 2**32 - 1``."""
    out = np.empty(2 * len(weight), np.uint32)
    max_deg = max_degree(indptr)
    q, small, large = np.empty(max_deg, np.float64), np.empty(max_deg, np.int64), np.empty(max_deg, np.int64)
    for v in range(len(indptr) - 1):
        s, n = indptr[v], indptr[v + 1] - indptr[v]
        total, heaviest = 0.0, np.int64(0)  # not a literal 0 (sampling.kernels.hop_kernel)
        for j in range(n):
            w = weight[s + j]
            if w > 0:
                total += w
                heaviest = j if not weight[s + heaviest] >= w else heaviest
        if n and total <= 0.0:
            for j in range(n):
                out[2 * (s + j)], out[2 * (s + j) + 1] = 0, 0xFFFFFFFF
            continue
        _vose(weight, s, n, total, heaviest, q, small, large, out)
    return out


@njit(cache=True, nogil=True, inline="always")
def _set(out, s, j, prob, alias, drawable):
    if not drawable:
        out[2 * (s + j)], out[2 * (s + j) + 1] = 0, alias
    elif prob >= 1.0:
        out[2 * (s + j)], out[2 * (s + j) + 1] = 0xFFFFFFFF, j
    else:
        out[2 * (s + j)], out[2 * (s + j) + 1] = max(np.uint32(1), np.uint32(prob * 4294967296.0)), alias


@njit(cache=True, nogil=True)
def _vose(weight, s, n, total, heaviest, q, small, large, out):
    ns = nl = 0
    for j in range(n):
        w = weight[s + j]
        q[j] = (w if w > 0 else 0.0) * n / total
        if q[j] < 1.0:
            small[ns] = j
            ns += 1
        else:
            large[nl] = j
            nl += 1
    while ns > 0 and nl > 0:
        ns, nl = ns - 1, nl - 1
        lo, hi = small[ns], large[nl]
        _set(out, s, lo, q[lo], hi, weight[s + lo] > 0)
        q[hi] = (q[hi] + q[lo]) - 1.0
        if q[hi] < 1.0:
            small[ns] = hi
            ns += 1
        else:
            large[nl] = hi
            nl += 1
    for i in range(nl):
        _set(out, s, large[i], 1.0, large[i], True)
    for i in range(ns):  # rounding leftovers: kept if drawable, else always sent to the heaviest edge
        j = small[i]
        _set(out, s, j, 1.0, heaviest, weight[s + j] > 0)


@njit(cache=True, nogil=True)
def weighted_packed(packed, alias):
    """The packed (source, edge ID) pairs with each edge's alias-table entry beside them (int32, 4 per
    edge): a weighted pick and the gather of what it picked read the same cache line."""
    out = np.empty(2 * len(packed), np.int32)
    for p in range(len(packed) // 2):
        out[4 * p], out[4 * p + 1] = packed[2 * p], packed[2 * p + 1]
        out[4 * p + 2], out[4 * p + 3] = np.int32(alias[2 * p]), np.int32(alias[2 * p + 1])
    return out


COMPACT_ALIAS_BITS = 16  # blocks whose degrees fit this many offset bits get 12-byte weighted records


@njit(cache=True, nogil=True)
def max_degree(indptr):
    """The largest degree of a CSC pointer array (0 when empty)."""
    out = 0
    for v in range(len(indptr) - 1):
        out = max(out, indptr[v + 1] - indptr[v])
    return out


@njit(cache=True, nogil=True)
def compact_weighted_packed(packed, alias, bits):
    """The packed (source, edge ID) pairs with each edge's alias-table entry folded into one int32 beside
    them (3 per edge, against 4 for :func:`weighted_packed`: fewer cache lines per weighted pick). The
    low ``bits`` hold the alias offset, the rest the threshold with those bits cleared (a kept column
    keeps at least ``2**bits``), so a column's kept share moves by less than ``2**(bits - 32)``.
    ``bits`` must exceed every offset: all of them set, with a zero threshold, marks a destination
    without a positive weight."""
    mask = np.uint32((1 << bits) - 1)
    out = np.empty(3 * (len(packed) // 2), np.int32)
    for p in range(len(packed) // 2):
        threshold, other = np.uint32(alias[2 * p]), np.uint32(alias[2 * p + 1])
        kept = threshold & ~mask
        if threshold != 0 and kept == 0:
            kept = mask + np.uint32(1)
        code = mask if other == np.uint32(0xFFFFFFFF) else kept | (other & mask)
        out[3 * p], out[3 * p + 1], out[3 * p + 2] = packed[2 * p], packed[2 * p + 1], np.int32(code)
    return out


@njit(cache=True, nogil=True)
def time_records(indptr, key, src, eid, keys, pairs, order, blocked=False):
    """Each destination's edges in time order: the ``i``-th edge in that order (within its destination's
    range) has its time less the smallest time of ``key`` in ``keys``, its source and edge ID in
    ``pairs`` and its CSC position in ``order[i]``. The time cut reads only the keys, the gather of what
    is picked only the pairs. The outputs are filled (int32 where the values fit: :func:`narrow_times`);
    returns the time subtracted. Equal times are ordered latest position first, so the last ``k`` of a
    prefix are the earliest positions among equal times (the rule of the scan over CSC order).

    Apart (``blocked`` False): ``keys[i]``, ``pairs[2i]``/``pairs[2i + 1]``. Blocked (``keys`` and ``pairs``
    one array of 3 values an edge): a destination whose edges are positions ``[s, s + d)`` holds its keys
    at ``[3s, 3s + d)`` and its pairs right after them, position ``i``'s at ``2i + s + d``: the lines the
    cut reads and those the picks read are neighbours (:func:`key_at`, :func:`pair_at`)."""
    base = np.int64(0)
    if len(key):
        base = key[0]
        for p in range(len(key)):
            base = min(base, key[p])
    for v in range(len(indptr) - 1):
        s, n = indptr[v], indptr[v + 1] - indptr[v]
        if n == 0:
            continue
        koff, poff = (2 * s, s + n) if blocked else (np.int64(0), np.int64(0))
        ordered = True
        for j in range(1, n):
            ordered &= key[s + j] > key[s + j - 1]
        if ordered:
            for j in range(n):
                _record(keys, pairs, order, key, src, eid, base, s + j, s + j, koff, poff)
            continue
        perm = np.argsort(key[s: s + n][::-1], kind="mergesort")
        for i in range(n):
            _record(keys, pairs, order, key, src, eid, base, s + i, s + n - 1 - perm[i], koff, poff)
    return base


@njit(cache=True, nogil=True, inline="always")
def _record(keys, pairs, order, key, src, eid, base, at, p, koff, poff):
    keys[at + koff], pairs[2 * at + poff], pairs[2 * at + poff + 1] = key[p] - base, src[p], eid[p]
    order[at] = p


def split_records(indptr, split, allowed, packed, pairs, order, counts, chunk=1 << 20):
    """Each destination's edges with the link splits ``allowed`` admits first (bit ``1 << split`` set), the rest
    after them, each part in CSC order: the ``i``-th edge in that order has its (source, edge ID) pair at
    ``pairs[2i]``/``pairs[2i + 1]`` (from the packed pairs) and its CSC position in ``order[i]``;
    ``counts[v]``: how many of destination ``v``'s edges are admitted. A masked pick is then a plain pick
    over a prefix (:func:`sampling.kernels.picks._pick_prefix`).

    numpy, not a kernel: one build per block, stored after (a kernel would be one more specialisation for
    every warm-up to compile). Destinations go by in runs of about ``chunk`` edges (a hub's alone), so its
    scratch is a few edge-sized int64 arrays of a run, not of the block."""
    nodes = len(indptr) - 1
    src_pairs, dst_pairs = packed.reshape(-1, 2), pairs.reshape(-1, 2)
    v0 = 0
    while v0 < nodes:
        v1 = int(np.searchsorted(indptr, indptr[v0] + chunk, side="right")) - 1
        v1 = min(max(v1, v0 + 1), nodes)  # at least one destination, a hub's run past ``chunk``
        s0, s1 = int(indptr[v0]), int(indptr[v1])
        starts, degs = indptr[v0:v1] - s0, np.diff(indptr[v0:v1 + 1])
        admitted = (np.int64(allowed) >> split[s0:s1].astype(np.int64)) & 1
        before = np.zeros(s1 - s0 + 1, np.int64)  # admitted edges before each position of the run
        np.cumsum(admitted, out=before[1:])
        owner = np.repeat(np.arange(v1 - v0), degs)  # each edge's destination, from the run's first
        first, head = starts[owner], before[starts][owner]  # its destination's start, admitted before it
        count = before[starts + degs] - before[starts]
        rank = before[:-1] - head  # admitted edges of its destination before it
        local = np.arange(s1 - s0)
        at = s0 + np.where(admitted == 1, first + rank, first + count[owner] + (local - first - rank))
        dst_pairs[at] = src_pairs[s0:s1]
        order[at] = s0 + local
        counts[v0:v1] = count
        v0 = v1


@njit(cache=True, nogil=True, inline="always")
def key_at(start, blocked):
    """Where the time-sorted keys of a destination whose edges start at ``start`` begin
    (:func:`time_records`: ``3 * start`` blocked, else ``start``)."""
    return 3 * start if blocked else start


@njit(cache=True, nogil=True, inline="always")
def pair_at(position, end):
    """Where the (source, edge ID) pair of time-sorted ``position`` begins in blocked records, ``end`` its
    destination's end (:func:`time_records`)."""
    return 2 * position + end


def narrow_times(key: np.ndarray) -> bool:
    """Whether the times ``key`` span less than 2**31 (:func:`time_records` keys fit int32)."""
    return len(key) == 0 or int(key.max()) - int(key.min()) < 2**31 - 1


def derived(kind: str, sources: tuple[np.ndarray, ...], build: Callable[[], tuple[np.ndarray, ...]], count: int,
            origin: str = "", cache_dir: str | None = None) -> tuple[np.ndarray, ...]:
    """The arrays ``build()`` derives from ``sources``, built once per process (the last 64 kept); with
    ``origin`` (what the sources are, e.g. a dataset's checksums) and ``cache_dir`` also
    stored there and memory-mapped (copy-on-write: writable, as the kernels want)."""
    key = (kind, *(id(a) for a in sources))
    with _LOCK:
        hit = _BUILT.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
            _BUILT.move_to_end(key)
            return hit[1]
    stored = origin and cache_dir and sum(a.nbytes for a in sources) >= STORE_MIN_BYTES
    result = _stored(kind, origin, cache_dir, build, count) if stored else tuple(in_huge_pages(a) for a in build())
    with _LOCK:
        _BUILT[key] = (sources, result)  # holding the sources keeps their ids from being reused
        while len(_BUILT) > _KEEP:
            _BUILT.popitem(last=False)
    return result


def _stored(kind: str, origin: str, cache_dir: str, build: Callable[[], tuple[np.ndarray, ...]], count: int
            ) -> tuple[np.ndarray, ...]:
    digest = hashlib.sha256(f"{kind}|{origin}".encode()).hexdigest()[:32]
    folder = os.path.join(cache_dir, "derived")
    paths = [os.path.join(folder, f"{kind}-{digest}-{i}.npy") for i in range(count)]
    try:
        if os.path.exists(paths[0]):  # written last: the others are complete
            arrays = _mapped(paths)
            _touch(paths[0])
            return arrays
    except (OSError, ValueError):
        logger.warning("derived %s arrays in %s are unreadable; building them again", kind, folder)
    result = build()
    try:
        os.makedirs(folder, exist_ok=True)
        for path, array in reversed(list(zip(paths, result))):  # the first one is written last: the commit
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            with open(tmp, "wb") as f:
                np.save(f, array)
            os.replace(tmp, path)
        arrays = _mapped(paths)
    except OSError as exc:  # a read-only or full cache: keep the arrays in memory
        logger.warning("cannot store derived %s arrays in %s (%s); keeping them in memory", kind, folder, exc)
        return result
    trim(folder, keep=f"{kind}-{digest}")
    return arrays


def _mapped(paths: list[str]) -> tuple[np.ndarray, ...]:
    """The stored arrays, mapped copy-on-write, advised for huge pages before the sampler reads them at random."""
    arrays = tuple(np.load(p, mmap_mode="c") for p in paths)
    for array in arrays:
        advise_huge_pages(array)
    return arrays


def _touch(path: str) -> None:
    """Mark a stored entry used now (its first file's modification time: what :func:`trim` orders by)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache: nothing is trimmed there either


def max_bytes() -> int:
    """The stored derived arrays kept per cache directory: ``$GRAPHSTORE_DERIVED_MAX_BYTES`` (e.g. ``50GB``),
    else 16 GiB."""
    from graphstore.storage.cache import parse_size

    raw = os.environ.get(ENV_MAX_BYTES)
    return DEFAULT_MAX_BYTES if not raw else int(parse_size(raw, f"${ENV_MAX_BYTES}") or 0)


def trim(folder: str, keep: str = "", limit: int | None = None) -> list[str]:
    """Remove the least recently used entries of the derived folder ``folder`` until its files take at most
    ``limit`` bytes (default :func:`max_bytes`); never the entry named ``keep`` (``kind-digest``). Datasets
    opened once (a temporary copy, a re-ingest to a new path) leave entries nobody reads again: without
    this the folder only grows. An entry's first file goes first, so a reader sees it as absent, never
    half. Writers' temporary files over a day old are removed too. Returns the entries removed. Processes
    that map a removed entry keep reading it (the file lives on until unmapped); one that finds it gone
    builds it again."""
    limit = max_bytes() if limit is None else limit
    entries: dict[str, list] = {}  # name -> [last use (None: no first file), bytes, files, newest file's time]
    now = time.time()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except OSError:
            continue  # removed meanwhile
        if ".npy.tmp-" in name:
            if now - st.st_mtime > _STALE_SECONDS:
                _remove(path)
            continue
        entry, _, index = name.removesuffix(".npy").rpartition("-")
        if not entry or not index.isdigit():
            continue  # not ours
        record = entries.setdefault(entry, [None, 0, [], 0.0])
        record[1] += st.st_size
        record[2].append((int(index), path))
        record[3] = max(record[3], st.st_mtime)
        if index == "0":
            record[0] = st.st_mtime
    # an entry without its first file is being written (recent files), else a writer died mid-way: first out
    total = sum(r[1] for r in entries.values())
    removed = []
    for entry, (used, size, files, newest) in sorted(entries.items(), key=lambda kv: kv[1][0] or 0.0):
        if total <= limit:
            break
        if entry == keep or (used is None and now - newest < _STALE_SECONDS):
            continue
        for _, path in sorted(files):  # the commit file first
            _remove(path)
        total -= size
        removed.append(entry)
    if removed:
        logger.info("derived arrays in %s: removed %d least recently used entr%s to stay within %d bytes ($%s)",
                    folder, len(removed), "y" if len(removed) == 1 else "ies", limit, ENV_MAX_BYTES)
    return removed


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # another process removed it first
