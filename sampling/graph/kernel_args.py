"""The arguments of the sampling kernels for a run of local blocks: topology tuples and the arrays of
the variants a sampler uses (weights' alias tables, time-sorted edges, split masks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.errors import InvalidInputError
from sampling.graph import derived
from sampling.graph.topology import CSCBlock
from sampling.kernels.hop_kernel import variants_csc
from sampling.kernels.structs import ChunkFiles, SplitRecords, TimeRecords, Topology, VariantArrays


@dataclass(frozen=True)
class Variants:
    """The per-edge decisions of a sampler (all off: the plain path). ``node_time`` (per node, global
    IDs) is the source nodes' times when ``temporal`` and the time is a node attribute."""

    weighted: bool = False
    temporal: bool = False
    last: bool = False
    disjoint: bool = False
    node_time: np.ndarray | None = None

    @property
    def plain(self) -> bool:
        return not (self.weighted or self.temporal or self.disjoint)


BLOCK_ARITY = 4  # the fewest entries of a per-block tuple: the kernels compile once for 1 to 4 blocks


def arity(blocks: int) -> int:
    """The length of the kernels' per-block tuples for ``blocks`` blocks: at least :data:`BLOCK_ARITY`, else
    the next power of two. numba compiles a kernel for each tuple length, so a rank serving 1, 2, 3 or 4
    partitions runs the same compiled kernels (the warm-up's), and 5 to 8 share the next."""
    return max(BLOCK_ARITY, 1 << (blocks - 1).bit_length())


def padded(arrays: tuple[np.ndarray, ...] | None, length: int) -> tuple[np.ndarray, ...] | None:
    """``arrays`` (one per block) to ``length`` entries, the rest empty arrays of the same type (the kernels
    index blocks below their count only)."""
    if arrays is None:
        return None
    return tuple(arrays) + (np.zeros(0, arrays[0].dtype),) * (length - len(arrays))


def _ready(array: np.ndarray, dtype: Any) -> np.ndarray:
    """``array`` as the kernels take it: contiguous, writable (copy-on-write maps are) and of ``dtype``
    (a copy only when it is not)."""
    if array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable:
        return array
    return np.array(array, dtype=dtype, order="C")


class BlockArgs:
    """Kernel arguments of ``blocks`` (consecutive destination ranges) under ``variants``.

    ``topo`` is the kernels' :class:`~sampling.kernels.structs.Topology`; :meth:`var` their
    :class:`~sampling.kernels.structs.VariantArrays`.
    The packed layout is read when every block has it (also by the filters, for source IDs). Times:
    edge times (``CSCBlock.time``) or the source type's ``node_time``; with exactly one of them each
    destination's edges are cut by a search over a time-sorted copy of its times, and the picks are read
    from the (source, edge ID) pairs in the same order (:func:`sampling.graph.derived.time_records`): they are
    time-sorted positions until :meth:`csc_positions` translates them; with both they are scanned;
    with neither there is no time constraint (``timed`` is False).
    """

    def __init__(self, blocks: list[CSCBlock], variants: Variants, node_time: np.ndarray | None = None,
                 packed: bool = True) -> None:
        self.blocks = blocks
        packs = packed and all(_packs(b) for b in blocks)
        _refuse_unmapped(blocks, packs, variants, node_time)  # before any derived array is built
        i64, i32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
        indptrs = tuple(_ready(b.indptr, np.int64) for b in blocks)
        indices = tuple(i64 if packs else _ready(b.indices, np.int64) for b in blocks)
        eids = tuple(i64 if packs else _ready(b.eid, np.int64) for b in blocks)
        packed_ = tuple(_ready(b.packed, np.int32) if packs else i32 for b in blocks)
        packed_pairs = packed_
        self.weights = self.aliases = None
        self.astride, self.amask = 2, 0
        self.use_packed = 2 if packs else 0  # int32 per edge in ``packed``
        if variants.weighted:
            self.weights = tuple(_ready(b.weight, np.float64) for b in blocks)
            self.aliases = tuple(_aliases(b, w) for b, w in zip(blocks, self.weights))
            if packs:  # the alias entries beside the packed pairs: a pick and its gather share a line
                bits = max(1, max(int(derived.max_degree(i)) for i in indptrs).bit_length())
                if bits <= derived.COMPACT_ALIAS_BITS:  # 12 bytes an edge: threshold and offset in one word
                    packed_ = tuple(_compact_packed(b, p, a, bits) for b, p, a in zip(blocks, packed_, self.aliases))
                    self.astride, self.amask = 3, (1 << bits) - 1
                else:
                    packed_ = tuple(_weighted_packed(b, p, a) for b, p, a in zip(blocks, packed_, self.aliases))
                    self.astride = 4
                self.aliases, self.use_packed = tuple(p[2:] for p in packed_), self.astride
        self.offsets = np.array([b.lo for b in blocks] + [blocks[-1].hi], np.int64)
        self.src, self.stride = (packed_, self.use_packed) if packs else (indices, 1)
        self.parts = np.array([b.part for b in blocks], np.int32)
        self._times(blocks, variants, node_time, packed_pairs if packs else None)
        masked = any(len(b.split) for b in blocks)
        self.splits = tuple(_ready(b.split, np.int8) for b in blocks) if masked else None
        self.allowed = blocks[0].allowed if masked else 0
        self.plain = not (variants.weighted or variants.disjoint or self.timed or masked)
        self.files = _unmapped(blocks)
        n = arity(len(blocks))  # the per-block tuples the kernels read, padded to their length
        self.msort = None  # uniform picks under the mask alone: over each destination's admitted edges, first
        if masked and packs and not (variants.weighted or self.timed):  # mapped: _refuse_unmapped said so
            built = [_split_records(b, p, self.allowed) for b, p in zip(blocks, packed_pairs)]
            pairs, order, counts = (padded(tuple(r[i] for r in built), n) for i in range(3))
            self.msort = SplitRecords(pairs, order, counts, self.offsets[:-1])
        self.topo = Topology(padded(indptrs, n), padded(indices, n), padded(eids, n), padded(packed_, n),
                             self.use_packed, self.offsets, self.files)
        self.src, self.weights, self.aliases, self.times, self.splits = (
            padded(a, n) for a in (self.src, self.weights, self.aliases, self.times, self.splits))

    def _times(self, blocks: list[CSCBlock], variants: Variants, node_time: np.ndarray | None,
               pairs: tuple[np.ndarray, ...] | None) -> None:
        self.times = self.tsort = self.node_time = None
        edge_times = variants.temporal and all(len(b.time) == b.num_edges for b in blocks)
        node_time = _ready(node_time, np.int64) if variants.temporal and node_time is not None else None
        self.timed = edge_times or node_time is not None
        if edge_times and node_time is not None:  # both constrain: scanned
            self.times, self.node_time = tuple(_ready(b.time, np.int64) for b in blocks), node_time
        elif self.timed:
            spans = [node_time] if node_time is not None else [np.asarray(b.time) for b in blocks]
            narrow = all(derived.narrow_times(t) for t in spans)
            wide_pos = any(b.num_edges >= 2**31 for b in blocks)
            built = [_time_records(b, node_time, p, narrow, wide_pos)
                     for b, p in zip(blocks, pairs or [None] * len(blocks))]
            n = arity(len(blocks))
            keys, pairs, order = (padded(tuple(r[i] for r in built), n) for i in range(3))
            self.tsort = TimeRecords(keys, pairs, order, np.array([r[3][0] for r in built], np.int64),
                                     np.array([r[3][1] for r in built], np.int64),
                                     np.array([r[4] for r in built], np.int64))

    def csc_positions(self, pos: np.ndarray, block_edges: np.ndarray) -> np.ndarray:
        """``pos`` as CSC positions: a time-sorted pick's position is translated (in place) through its
        block's order; ``block_edges`` (rows of each block's first edge, as the kernels fill them)."""
        sorted_ = self.tsort if self.tsort is not None else self.msort
        if sorted_ is not None and len(pos):
            variants_csc(sorted_.order, np.ascontiguousarray(block_edges, np.int64).reshape(-1, len(self.blocks) + 1),
                         pos)
        return pos

    @staticmethod
    def time_sorted(var: VariantArrays) -> bool:
        """Whether ``var`` (of :meth:`var`) has re-sorted records (by time, or admitted splits first): its picks
        are positions in that order, until :meth:`csc_positions` translates them."""
        return var.tsort is not None or var.msort is not None

    def var(self, last: bool, timed: bool, exclusion: tuple | None = None) -> VariantArrays:
        """The kernels' variant record; ``timed``: limits are given (else times are ignored); ``exclusion`` =
        ``(sorted keys, multiplier, mode, node filter)`` of links to drop
        (:func:`sampling.graph.edgemask.exclusion`)."""
        t = timed and self.timed
        off = (None, 0, 0, None)
        excl, mul, mode, nodes = exclusion if exclusion is not None and exclusion[2] else off
        if excl is not None and self.files is not None:
            raise InvalidInputError("a link batch's exclusion reads each candidate edge, which sampling a partition "
                                    "read without mapping does not do yet; leave the dataset mapped for link prediction")
        return VariantArrays(self.src, self.stride, self.weights, self.aliases, self.astride, self.amask,
                             self.times if t else None, self.tsort if t else None, self.node_time if t else None,
                             bool(last), self.splits, int(self.allowed), excl, int(mul), int(mode), nodes, self.msort)


def _packs(block: CSCBlock) -> bool:
    """Whether ``block`` has the packed (source, edge ID) pairs: one read without mapping always has them (its
    arrays are empty; :func:`sampling.graph.topology.from_dataset` checked the stored ones)."""
    if block.files is not None:
        return True
    return len(block.packed) == 2 * len(block.indices) and len(block.indices) > 0


def _refuse_unmapped(blocks: list[CSCBlock], packs: bool, variants: Variants, node_time: np.ndarray | None) -> None:
    """Raise when blocks read without mapping would need what the unmapped kernel does not read: per-edge
    weights, times or link splits (or a mix of mapped and unmapped blocks)."""
    files = [getattr(b, "files", None) for b in blocks]
    if all(f is None for f in files):
        return
    if any(f is None for f in files):
        raise InvalidInputError("a sampler over partitions some mapped and some read without mapping: read all of "
                                "them one way (Dataset.read_unmapped over every partition this process samples)")
    timed = variants.temporal and (node_time is not None or all(len(b.time) == b.num_edges for b in blocks))
    unsupported = [name for name, on in (("weighted", variants.weighted), ("temporal", timed),
                                         ("link-split masked", any(len(b.split) for b in blocks))) if on]
    if unsupported or not packs:
        what = " and ".join(unsupported) or "without packed pairs"
        raise InvalidInputError(f"sampling {what} reads per-edge arrays that a partition read without mapping does "
                                "not serve yet: sample uniformly (plain or disjoint), or leave the dataset mapped")


def _unmapped(blocks: list[CSCBlock]) -> ChunkFiles | None:
    """The topology's ``files``: the chunk descriptors of the blocks' ``indptr`` and packed pairs; ``None``
    when every block is mapped (:func:`_refuse_unmapped` has checked the rest)."""
    files = [getattr(b, "files", None) for b in blocks]
    if any(f is None for f in files):
        return None
    out = []
    for k, dtype in ((0, np.int64), (1, np.int32)):
        arrays = [f[k] for f in files]
        if any(a.dtype != dtype or a.row_bytes != 8 for a in arrays):
            raise InvalidInputError(f"{arrays[0].where}: stored as {arrays[0].dtype} rows of {arrays[0].row_bytes} "
                                    "bytes, not the layout reading without mapping expects; re-ingest the dataset")
        first = np.cumsum([0] + [len(a.fds) for a in arrays]).astype(np.int64)
        out += [np.concatenate([a.fds for a in arrays]).astype(np.int64), first,
                np.array([a.chunk_rows for a in arrays], np.int64)]
    return ChunkFiles(*out)


def _aliases(block: CSCBlock, weight: np.ndarray) -> np.ndarray:
    indptr = _ready(block.indptr, np.int64)
    return derived.derived("alias", (block.indptr, block.weight), lambda: (derived.alias_table(indptr, weight),), 1,
                           *_origin(block, "weight"))[0]


def _weighted_packed(block: CSCBlock, packed: np.ndarray, alias: np.ndarray) -> np.ndarray:
    return derived.derived("wpacked", (block.packed, block.weight), lambda: (derived.weighted_packed(packed, alias),),
                           1, *_origin(block, "weight-packed"))[0]


def _compact_packed(block: CSCBlock, packed: np.ndarray, alias: np.ndarray, bits: int) -> np.ndarray:
    return derived.derived(f"wpacked12-{bits}", (block.packed, block.weight),
                           lambda: (derived.compact_weighted_packed(packed, alias, bits),), 1,
                           *_origin(block, f"weight-packed12-{bits}"))[0]


def _time_records(block: CSCBlock, node_time: np.ndarray | None, pairs: np.ndarray | None, narrow: bool,
                  wide_pos: bool) -> tuple[Any, ...]:
    """The block's time-sorted records (:func:`sampling.graph.derived.time_records`): keys, (source, edge ID)
    pairs, CSC positions, the time subtracted with the largest key (two values), and whether blocked.
    Blocked (keys and pairs one int32 array, each destination's keys beside its pairs) when the keys fit
    int32 (``narrow``) and the block has its packed pairs; else apart: int32 keys when ``narrow``, int32
    pairs with the packed pairs."""
    indptr = _ready(block.indptr, np.int64)
    blocked = narrow and pairs is not None
    key_type, pair_type = (np.int32 if narrow else np.int64), (np.int32 if pairs is not None else np.int64)
    pos_type = np.int64 if wide_pos else np.int32
    layout = "tblock32" if blocked else f"tkeys{32 if narrow else 64}-{32 if pairs is not None else 64}"
    kind = f"{layout}-{64 if wide_pos else 32}" + ("n" if node_time is not None else "")
    sources = (block.indptr, block.time) if node_time is None else (block.indptr, block.indices, node_time)

    def build() -> tuple[np.ndarray, ...]:
        key = _ready(block.time, np.int64) if node_time is None else node_time[np.asarray(block.indices)]
        src, eid = (pairs[0::2], pairs[1::2]) if pairs is not None else (_ready(block.indices, np.int64),
                                                                         _ready(block.eid, np.int64))
        order = np.empty(len(key), pos_type)
        if blocked:
            records = np.empty(3 * len(key), np.int32)
            base = derived.time_records(indptr, key, src, eid, records, records, order, True)
            return records, order, np.array([base, int(key.max()) - base if len(key) else 0], np.int64)
        keys, out = np.empty(len(key), key_type), np.empty(2 * len(key), pair_type)
        base = derived.time_records(indptr, key, src, eid, keys, out, order)
        return keys, out, order, np.array([base, int(keys.max()) if len(keys) else 0], np.int64)

    what = "node-time" if node_time is not None else "time"
    if blocked:
        records, order, bounds = derived.derived(kind, sources, build, 3, *_origin(block, what))
        return records, records, order, bounds, True
    return (*derived.derived(kind, sources, build, 4, *_origin(block, what)), False)


def _split_records(block: CSCBlock, pairs: np.ndarray, allowed: int) -> tuple[np.ndarray, ...]:
    """The block's edges with the splits ``allowed`` admits first per destination
    (:func:`sampling.graph.derived.split_records`): pairs, CSC positions, admitted counts."""
    indptr = _ready(block.indptr, np.int64)
    wide = block.num_edges >= 2**31

    def build() -> tuple[np.ndarray, ...]:
        out = np.empty(2 * block.num_edges, np.int32)
        order = np.empty(block.num_edges, np.int64 if wide else np.int32)
        counts = np.empty(len(indptr) - 1, np.int32)
        derived.split_records(indptr, _ready(block.split, np.int8), np.int64(allowed), pairs, out, order, counts)
        return out, order, counts

    return derived.derived(f"msplit{allowed}-{64 if wide else 32}", (block.indptr, block.split), build, 3,
                           *_origin(block, f"split-first-{allowed}"))


def _origin(block: CSCBlock, what: str) -> tuple[str, str | None]:
    return (f"{block.origin}|{what}", block.cache_dir) if block.origin else ("", None)
