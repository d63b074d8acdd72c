"""The records the sampling kernels take: named tuples numba compiles as structs (one field per value, read
by name, no cost over separate arguments), so the data crossing from the drivers into the kernels, and
from one phase to the next, is read as ``var.weights`` and ``hop.limits``, not ``var[2]`` or a 34th
positional parameter.

A variant that is off is a field of ``None``, and its type is part of the record's: numba still compiles one
specialisation per combination. numba prunes an untaken ``x is None`` branch only on a function's own
arguments, not on a record's fields, so a kernel whose body branches on a field passes the field on as an
argument to the function that branches (see :func:`sampling.kernels.picks.pick_block`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class Topology(NamedTuple):
    """The CSC blocks a kernel samples, one tuple entry per block: block ``b`` owns destinations
    ``[offsets[b], offsets[b + 1])``.

    ``packed``: each block's int32 values, ``use_packed`` of them per edge (source and edge ID first; 0: not
    used, ``indices``/``eids`` are); ``files``: :class:`ChunkFiles` when the blocks are read, not mapped
    (:mod:`sampling.kernels.unmapped`), else ``None``."""

    indptrs: tuple
    indices: tuple
    eids: tuple
    packed: tuple
    use_packed: int
    offsets: np.ndarray
    files: Any


class ChunkFiles(NamedTuple):
    """The chunk files of blocks read, not mapped: for the ``indptr`` arrays and for the packed pairs, the
    open file descriptors of every block's chunks (flat; block ``b``'s from ``*_first[b]`` to
    ``*_first[b + 1]``) and each block's rows per chunk."""

    indptr_fds: np.ndarray
    indptr_first: np.ndarray
    indptr_rows: np.ndarray
    pair_fds: np.ndarray
    pair_first: np.ndarray
    pair_rows: np.ndarray


class TimeRecords(NamedTuple):
    """Each block's edges sorted by time within each destination (:func:`sampling.graph.derived.time_records`).

    Per block: ``keys`` (time less ``base``), ``pairs`` (source and edge ID in the same order; the same
    array as ``keys`` when ``blocked``: keys and pairs interleaved per destination), ``order`` (each sorted
    position's CSC position); ``base``, ``latest`` (the largest key) and ``blocked`` (1 or 0) are arrays
    with one entry per block."""

    keys: tuple
    pairs: tuple
    order: tuple
    base: np.ndarray
    latest: np.ndarray
    blocked: np.ndarray


class SplitRecords(NamedTuple):
    """Each block's edges with the admitted link splits first within each destination
    (:func:`sampling.graph.derived.split_records`). Per block: ``pairs`` (source and edge ID in that order),
    ``order`` (each sorted position's CSC position), ``counts`` (admitted edges per destination, indexed from
    the block's first destination, ``lo``: one entry per block)."""

    pairs: tuple
    order: tuple
    counts: tuple
    lo: np.ndarray


class VariantArrays(NamedTuple):
    """The arrays and settings of a sampler's per-edge variants (:mod:`sampling.kernels.picks`); a variant
    that is off is ``None``.

    ``src``: per block, what the filters read an edge's source from (``src[b][stride * p]`` for CSC
    position ``p``); ``weights``/``aliases``: per block, edge weights and Walker's alias tables
    (``astride`` int32 words an edge, ``amask`` the offset bits of a compact entry); ``times``: edge
    times per CSC position; ``tsort``: :class:`TimeRecords`; ``node_time``: per source node; ``last``:
    take the latest edges, not uniform ones; ``splits``: per block, each edge's link split, admitted when
    bit ``1 << split`` is in ``allowed``; ``excl``: sorted keys of links to drop (``excl_mode`` 1: key
    ``src * excl_mul + dst``, 2: ``dst * excl_mul + src``, 3: either), ``excl_nodes``: a filter of the links'
    ends, the only nodes such a key holds (:func:`sampling.graph.edgemask.node_filter`; ``None`` with ``excl``);
    ``msort``: :class:`SplitRecords` (uniform picks under a split mask, without weights or times), else ``None``."""

    src: tuple
    stride: int
    weights: Any
    aliases: Any
    astride: int
    amask: int
    times: Any
    tsort: Any
    node_time: Any
    last: bool
    splits: Any
    allowed: int
    excl: Any
    excl_mul: int
    excl_mode: int
    excl_nodes: Any
    msort: Any


class Hop(NamedTuple):
    """One hop's frontier and how to draw from it: the frontier is ``nodes[lo:hi]`` (global IDs);
    ``k`` edges per node (all when ``k < 0``), with ``replace``ment or not; ``in_order``: visit the
    frontier in its own order within a block (else, when large, by ID); ``limits``: each frontier node's
    latest admissible time, or ``None``."""

    nodes: np.ndarray
    lo: int
    hi: int
    k: int
    replace: bool
    in_order: bool
    limits: Any


class Frontier(NamedTuple):
    """A hop's frontier grouped by block: ``order[t]`` is the frontier position (from the hop's ``lo``) of
    the ``t``-th node, ``ids[t]`` its global ID, ``starts[t]``/``degs[t]`` its CSC start and degree; block
    ``b``'s nodes are ``t`` in ``[bounds[b], bounds[b + 1])``."""

    order: np.ndarray
    bounds: np.ndarray
    ids: np.ndarray
    starts: np.ndarray
    degs: np.ndarray


class Edges(NamedTuple):
    """Sampled edges, one entry each: global source IDs (``row``, relabelled to local IDs after the hop),
    frontier positions of their destinations (``col``), edge IDs (``eid``) and CSC positions (``pos``)."""

    row: np.ndarray
    col: np.ndarray
    eid: np.ndarray
    pos: np.ndarray


class Scratch(NamedTuple):
    """The picks' scratch, each at least the largest degree of a hop: draw bookkeeping (``draws``), the
    candidates a filter admits (``cand``), their times (``tkeys``) and cumulative weights (``wkeys``)."""

    draws: np.ndarray
    cand: np.ndarray
    tkeys: np.ndarray
    wkeys: np.ndarray


class IdMap(NamedTuple):
    """A thread's map of global node IDs to a batch's local ones (:mod:`sampling.kernels.idmap`): ``seen``
    (a bit per node) with ``dense`` (a local ID per node), or, when ``seen`` is empty, ``table`` (a hash of
    the batch's nodes, grown as needed: the kernel returns the one it ends with)."""

    seen: np.ndarray
    dense: np.ndarray
    table: np.ndarray
