"""Which edges messages may pass over (a link split mask) and which a batch must not see (its own links)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from graphstore.dataset import layout
from graphstore.errors import InvalidInputError
from graphstore.dataset.linksplit import SPLIT_NAMES, LinkSplit, assign, check_edge_type, log_computed

_EMPTY_I8 = np.zeros(0, np.int8)
_COMPUTED: dict[tuple, list[np.ndarray]] = {}
_LOCK = threading.RLock()


@dataclass(frozen=True)
class MessageEdges:
    """Messages pass only over the edges of ``edge_type`` whose link split is in ``allowed``
    (0 train, 1 val, 2 test; PyG's convention: ``(0,)`` to train and validate, ``(0, 1)`` to test).
    A bipartite type's reverse relation (``rev_writes`` of ``writes``) is held out with its links;
    other edge types are not restricted. The split is the dataset's stored one (edge attribute
    ``link_split``, ``graphstore ingest --link-split``), an in-memory graph's edge attribute ``attr``,
    or, when ``rule`` is given, computed by that rule exactly as ingest would (every process that
    samples computes the same split: deterministic, no communication).

    Examples
    --------
    >>> MessageEdges(allowed=(0, 1)).bits
    3
    """

    edge_type: Any = None
    allowed: tuple[int, ...] = (0,)
    rule: LinkSplit | None = None
    attr: str = layout.LINK_SPLIT

    def __post_init__(self) -> None:
        allowed = tuple(sorted({int(v) for v in self.allowed}))
        if not allowed or any(v not in (0, 1, 2) for v in allowed):
            names = ", ".join(f"{i} ({name})" for i, name in enumerate(SPLIT_NAMES))
            raise InvalidInputError(f"MessageEdges allowed={self.allowed!r}: give split values among {names}")
        object.__setattr__(self, "allowed", allowed)
        if isinstance(self.edge_type, list):
            object.__setattr__(self, "edge_type", tuple(self.edge_type))

    @property
    def bits(self) -> int:
        return sum(1 << v for v in self.allowed)

    def target(self, edge_types: list[Any]) -> Any:
        """The masked edge type as the graph names it (``edge_type`` may be a relation alone)."""
        if self.edge_type is None:
            return edge_types[0]
        for etype in edge_types:
            if etype == self.edge_type or (etype is not None and len(self.edge_type) == 1
                                           and etype[1] == self.edge_type[0]):
                return etype
        raise InvalidInputError(f"MessageEdges edge_type {self.edge_type!r} is not in the graph: {edge_types}")

    def applies_to(self, etype: Any, edge_types: list[Any]) -> bool:
        return etype == self.target(edge_types)

    def reverses(self, etype: Any, edge_types: list[Any]) -> bool:
        """Whether ``etype`` is a reverse relation of the masked bipartite type (``rev_writes`` of
        ``writes``): its edges ``v -> u`` take the split of the link ``u -> v``."""
        target = self.target(edge_types)
        return (etype is not None and target is not None and etype != target and target[0] != target[2]
                and (etype[0], etype[2]) == (target[2], target[0]))


def dataset_split(dataset: Any, part: int, etype: Any, mask: MessageEdges) -> np.ndarray:
    """The split of every edge of ``etype`` in partition ``part``, aligned with its CSC (int8)."""
    info = dataset.manifest.edge_type(etype)
    if mask.rule is None:
        if mask.attr not in info.attrs:
            raise InvalidInputError(
                f"{dataset.url}: edge type {info.name!r} has no stored link split ({mask.attr!r}); ingest with "
                "--link-split 0.8,0.1,0.1, or give MessageEdges a rule to compute one"
            )
        return dataset.partition(part)[1].edge_attr(mask.attr, info.name).numpy().astype(np.int8, copy=False)
    key = (dataset.url, id(dataset.manifest), info.name, mask.rule)
    with _LOCK:
        if key not in _COMPUTED:
            _COMPUTED[key] = computed_split(dataset, info.name, mask.rule)
        return _COMPUTED[key][part]


def reverse_split(dataset: Any, part: int, etype: Any, mask: MessageEdges) -> np.ndarray:
    """The split of the reverse relation ``etype``'s edges in partition ``part`` (CSC order): an edge
    ``v -> u`` takes the split of the link ``u -> v`` of the masked type; edges that reverse no link
    are train (they carry messages). Reads every partition's links once per process."""
    forward = dataset.manifest.edge_type(mask.target(dataset.edge_types))
    dst_t = next(t for t in dataset.manifest.node_types if t.key == forward.dst)
    with _LOCK:
        key = (dataset.url, id(dataset.manifest), "reverse", mask)
        if key not in _COMPUTED:
            keys, splits = [], []
            for p in range(dataset.num_parts):
                indptr, indices, _ = dataset.partition(p)[1].csc_arrays(forward.name)
                lo = dst_t.offsets[p]
                dst = np.repeat(np.arange(lo, lo + len(indptr) - 1), np.diff(indptr))
                keys.append(np.asarray(indices) * dst_t.num_nodes + dst)
                splits.append(dataset_split(dataset, p, forward.name, mask))
            all_keys = np.concatenate(keys)
            order = np.argsort(all_keys, kind="stable")
            _COMPUTED[key] = [all_keys[order], np.concatenate(splits)[order]]
        keys, splits = _COMPUTED[key]
    info = dataset.manifest.edge_type(etype)
    indptr, indices, _ = dataset.partition(part)[1].csc_arrays(info.name)
    lo = next(t for t in dataset.manifest.node_types if t.key == info.dst).offsets[part]
    link = np.repeat(np.arange(lo, lo + len(indptr) - 1), np.diff(indptr)) * dst_t.num_nodes + np.asarray(indices)
    pos = np.searchsorted(keys, link).clip(0, max(len(keys) - 1, 0))
    found = keys[pos] == link if len(keys) else np.zeros(len(link), bool)
    return np.where(found, splits[pos] if len(keys) else 0, 0).astype(np.int8)


def computed_split(dataset: Any, etype: Any, rule: LinkSplit) -> list[np.ndarray]:
    """Per partition, the split ``rule`` gives every edge of ``etype`` (CSC order): the ingest rule over
    the input node IDs (``orig_id``), so it equals the split ingest would store. Reads every partition."""
    manifest = dataset.manifest
    info = manifest.edge_type(etype)
    check_edge_type(rule, [info.name], {info.name: info.num_edges}, {info.name: list(info.attrs)}, dataset.url)
    src_t = next(t for t in manifest.node_types if t.key == info.src)
    dst_t = next(t for t in manifest.node_types if t.key == info.dst)
    orig = {t.name: np.concatenate([dataset.partition(p)[0][t.name, layout.ORIG_ID, None].numpy()
                                    for p in range(dataset.num_parts)]) for t in (src_t, dst_t)}
    src, dst, times, sizes = [], [], [], []
    for p in range(dataset.num_parts):
        gs = dataset.partition(p)[1]
        indptr, indices, _ = gs.csc_arrays(info.name)
        lo = dst_t.offsets[p]
        src.append(orig[src_t.name][np.asarray(indices)])
        dst.append(orig[dst_t.name][np.repeat(np.arange(lo, lo + len(indptr) - 1), np.diff(indptr))])
        if rule.by == "time":
            times.append(gs.edge_attr(rule.time_attr, info.name).numpy())
        sizes.append(len(indices))
    log_computed(rule, f"{dataset.url} edge type {info.name!r}")
    split, _ = assign(np.concatenate(src), np.concatenate(dst), np.concatenate(times) if times else None, rule,
                      info.name is None or info.name[0] == info.name[2])
    return np.split(split, np.cumsum(sizes)[:-1])


def pyg_split(store: Any, mask: MessageEdges, eid: np.ndarray) -> np.ndarray:
    """The split of an in-memory graph's edge store, in CSC order (``eid`` = CSC position → edge)."""
    if mask.rule is not None or mask.attr not in store:
        raise InvalidInputError(f"MessageEdges: the graph's edge type has no edge attribute {mask.attr!r} holding "
                                "the link split (0 train, 1 val, 2 test); add it (rule= needs a graphstore dataset)")
    value = store[mask.attr]
    value = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    return value.astype(np.int8)[eid]


def exclusion(edge_types: list[Any], input_type: Any, row: Any, col: Any, num_dst: int
              ) -> dict[Any, tuple[np.ndarray, int, int, np.ndarray]]:
    """Per edge type, the ``(sorted keys, multiplier, mode, nodes)`` the kernels use to drop the links
    ``row[i] -> col[i]`` of a batch and their reverses (see :mod:`sampling.kernels.picks`); ``nodes``:
    :func:`node_filter` of the links' ends (of either type), the only nodes an excluded edge can join, so the
    kernels search the keys only for an edge whose both nodes it may hold."""
    row, col = _np(row), _np(col)
    keys = sorted_unique(row * num_dst + col)
    nodes = node_filter(np.concatenate([row, col]))
    out = {}
    for etype in edge_types:
        if etype == input_type or input_type is None:
            same = etype is None or etype[0] == etype[2]
            out[etype] = (keys, num_dst, 3 if same else 1, nodes)
        elif input_type[0] != input_type[2] and (etype[0], etype[2]) == (input_type[2], input_type[0]):
            out[etype] = (keys, num_dst, 2, nodes)  # the reverse relation (e.g. rev_writes) of a bipartite type
    return out


def link_batch(ends: np.ndarray, links: tuple[np.ndarray, np.ndarray] | None, num_dst: int
               ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None] | None:
    """A homogeneous link batch's seeds in one kernel call: its pairs' ``ends`` (sources then destinations,
    negatives included) as ``torch.unique(ends, return_inverse=True)`` gives them (sorted, and where each end is
    among them), and, when ``links`` (the sources and destinations of the pairs that are links) are given, the
    sorted keys and the node filter :func:`exclusion` makes of them. ``None`` when an end is negative or not
    below 2**31 (the caller names it)."""
    ends = np.ascontiguousarray(ends, np.int64)
    link_row, link_col = (_NO_IDS, _NO_IDS) if links is None else (np.ascontiguousarray(a, np.int64) for a in links)
    bits = 64 * max(1, -(-FILTER_BITS_PER_NODE * 2 * len(link_row) // 64)) if links is not None else 0
    if len(ends) >= 1 << 31:
        return None
    ok, seeds, inverse, keys, words = _link_batch(ends, link_row, link_col, np.int64(num_dst), np.int64(bits))
    if not ok:
        return None
    return seeds, inverse, (keys, words) if links is not None else None


_NO_IDS = np.zeros(0, np.int64)


@njit(cache=True, nogil=True)
def _link_batch(ends, link_row, link_col, num_dst, bits):
    """:func:`link_batch`'s pass: ``(whether every end was below 2**31 and not negative, seeds, each end's
    place among them, keys, filter words)``."""
    n = len(ends)
    words = np.empty(n, np.int64)  # (ID << 32) | position: sorted, each end's ID and where it came from
    for j in range(n):
        if ends[j] < 0 or ends[j] >= 1 << 31:
            return False, words[:0], words[:0], words[:0], np.zeros(0, np.uint64)
        words[j] = (ends[j] << 32) | j
    words.sort()
    seeds, inverse = np.empty(n, np.int64), np.empty(n, np.int64)
    u = -1
    for j in range(n):
        v = words[j] >> 32
        if u < 0 or v != seeds[u]:
            u += 1
            seeds[u] = v
        inverse[words[j] & 0xFFFFFFFF] = u
    keys = np.empty(len(link_row), np.int64)
    for i in range(len(link_row)):
        keys[i] = link_row[i] * num_dst + link_col[i]
    keys.sort()
    m = 0
    for i in range(len(keys)):  # sorted, repeats dropped
        if m == 0 or keys[i] != keys[m - 1]:
            keys[m] = keys[i]
            m += 1
    filt = np.zeros(bits // 64, np.uint64)
    for nodes in (link_row, link_col):  # node_filter's bits
        for i in range(len(nodes)):
            bit = (((np.uint64(nodes[i]) * _MIX) >> np.uint64(32)) * np.uint64(bits)) >> np.uint64(32)
            filt[bit >> np.uint64(6)] |= np.uint64(1) << (bit & np.uint64(63))
    return True, seeds[:u + 1], inverse, keys[:m], filt


# A node's bit in a node filter: its ID times an odd constant (mod 2^64, Fibonacci hashing), whose high 32
# bits are scaled onto the filter's bits. sampling.kernels.picks reads it with the same arithmetic.
FILTER_MIX = 0x9E3779B97F4A7C15
_MIX = np.uint64(FILTER_MIX)
FILTER_BITS_PER_NODE = 32  # a node not in the set finds its bit set about once in 32


def node_filter(nodes: np.ndarray) -> np.ndarray:
    """A bitmap (uint64 words) with the bit of each of ``nodes`` set: a node whose bit is clear is none of
    them; a set bit may belong to another node (about 1 in ``FILTER_BITS_PER_NODE``), so it is a hint to
    test exactly, never an answer."""
    nodes = np.asarray(nodes, np.int64)  # a node given twice sets its bit twice: no de-duplication needed
    bits = 64 * max(1, -(-FILTER_BITS_PER_NODE * len(nodes) // 64))
    flags = np.zeros(bits, np.bool_)
    flags[filter_bit(nodes, bits)] = True
    # bit b of word w is flag 64 w + b: the flags packed little-endian, read as little-endian words
    return np.packbits(flags, bitorder="little").view("<u8").astype(np.uint64, copy=False)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for a 1-D array, by one sort: a link batch's few hundred keys and ends take a
    fraction of the time of ``np.unique``, which in numpy 2.4 hashes the values first."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def filter_bit(nodes: np.ndarray, bits: int) -> np.ndarray:
    """Each node's bit in a filter of ``bits`` bits (see :func:`node_filter`)."""
    mixed = nodes.astype(np.uint64) * np.uint64(FILTER_MIX)  # wraps modulo 2^64, as the kernels' uint64 does
    return ((mixed >> np.uint64(32)) * np.uint64(bits)) >> np.uint64(32)


def _np(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, np.int64)


EMPTY_SPLIT = _EMPTY_I8
