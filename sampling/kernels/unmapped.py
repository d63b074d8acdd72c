"""One hop's topology reads over blocks read with ``pread`` instead of mapped (``Dataset.read_unmapped``).

The mapped kernel reads ``indptr`` and the packed (source, edge ID) pairs of each frontier node in
place. Unmapped, :func:`read_pointers` reads the same ``indptr`` entries by ``pread`` (ascending IDs
close together in one read) and :func:`stage_pairs` copies each node's pairs into a buffer of the hop
(neighbouring nodes' pairs in one read), so the picks run unchanged over the buffer; :func:`shift_positions`
turns their buffer positions back into CSC positions. The samples are the same as mapped.

``files`` = ``(indptr fds, indptr first, indptr chunk rows, pairs fds, pairs first, pairs chunk rows)``:
block ``b``'s chunk descriptors are ``fds[first[b]:first[b + 1]]`` (:func:`sampling.graph.kernel_args._unmapped`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphstore.errors import CorruptDatasetError
from graphstore.storage.fileio import read_span
from sampling.kernels.frontier import csc_pointers
from sampling.kernels.picks import pick_uniform

_WINDOW = 512  # indptr entries one read may span (4 KiB)
_GAP_EDGES = 512  # pairs (8 bytes each) between two nodes' edges that are read with them rather than apart


@njit(cache=True, nogil=True)
def pointers(files, indptrs, offsets, ids, bounds, starts, degs):
    """Phase 1: each frontier node's CSC start and degree, from the mapped ``indptrs`` when ``files`` is
    ``None``, else read (numba prunes the other branch: one specialisation each)."""
    if files is None:
        csc_pointers(indptrs, offsets, ids, bounds, starts, degs)
    else:
        read_pointers(files, offsets, ids, bounds, starts, degs)


@njit(cache=True, nogil=True)
def picks(files, state, fr, k, replace, f_lo, out, e, scratch, block_edges):
    """The plain picks of a hop over blocks read, not mapped, from ``e`` on (``fr`` the frontier grouped by
    block, :class:`~sampling.kernels.structs.Frontier`; ``out`` :class:`~sampling.kernels.structs.Edges`);
    returns the end, or -1 when ``files`` is ``None`` (mapped: the caller picks)."""
    if files is None:
        return np.int64(-1)
    bounds = fr.bounds
    stage, shift = stage_pairs(files, bounds, fr.order, fr.starts, fr.degs)
    e0 = e
    for b in range(len(bounds) - 1):
        block_edges[b] = e
        e = pick_uniform(state, fr, bounds[b], bounds[b + 1], k, replace, f_lo, out, e, scratch, stage)
    block_edges[len(bounds) - 1] = e
    shift_positions(out.pos, out.col, f_lo, shift, e0, e)
    return e


@njit(cache=True, nogil=True)
def read_pointers(files, offsets, ids, bounds, starts, degs):
    """Phase 1 unmapped: each frontier node's CSC start and degree, block by block."""
    win = np.empty(_WINDOW, np.int64)
    for b in range(len(bounds) - 1):
        fds = files.indptr_fds[files.indptr_first[b]:files.indptr_first[b + 1]]
        chunk_rows, lo = files.indptr_rows[b], offsets[b]
        w_lo, w_hi = np.int64(0), np.int64(0)  # the entries [w_lo, w_hi) in ``win``
        for t in range(bounds[b], bounds[b + 1]):
            g = ids[t] - lo
            if g < w_lo or g + 1 >= w_hi:  # read from g to the last of the next IDs that ascend within a window
                u = t
                while u + 1 < bounds[b + 1] and ids[u + 1] >= ids[u] and ids[u + 1] - lo + 2 - g <= _WINDOW:
                    u += 1
                n = ids[u] - lo + 2 - g
                if not read_span(fds, chunk_rows, 8, g, n, win, 0, 1):
                    raise CorruptDatasetError("reading a partition's indptr came back short (a truncated chunk file "
                                              "or a failing disk); run `graphstore verify` on the dataset")
                w_lo, w_hi = g, g + n
            starts[t] = win[g - w_lo]
            degs[t] = win[g + 1 - w_lo] - starts[t]


@njit(cache=True, nogil=True)
def stage_pairs(files, bounds, order, starts, degs):
    """Copy each frontier node's packed pairs into a buffer of the hop; returns ``(buffer, shift)``.

    ``starts`` become positions in the buffer, and ``shift[order[t]]`` is what a pick's buffer position
    gains to be its CSC position again. Within a block, nodes whose edges follow each other within
    ``_GAP_EDGES`` are read by one call (the frontier visits a large block's nodes by ascending ID).
    """
    nf = len(starts)
    run_lo, run_hi, run_at = np.empty(nf, np.int64), np.empty(nf, np.int64), np.empty(nf + 1, np.int64)
    run_block, run_of = np.empty(nf, np.int64), np.full(nf, -1, np.int64)
    runs, total = 0, np.int64(0)
    for b in range(len(bounds) - 1):
        for t in range(bounds[b], bounds[b + 1]):
            s, d = starts[t], degs[t]
            if d == 0:
                continue
            if runs > 0 and run_block[runs - 1] == b and run_lo[runs - 1] <= s <= run_hi[runs - 1] + _GAP_EDGES:
                run_hi[runs - 1] = max(run_hi[runs - 1], s + d)
            else:
                run_lo[runs], run_hi[runs], run_block[runs] = s, s + d, b
                runs += 1
            run_of[t] = runs - 1
    run_at[0] = 0
    for r in range(runs):
        run_at[r + 1] = run_at[r] + run_hi[r] - run_lo[r]
    total = run_at[runs]
    stage = np.empty(2 * total, np.int32)
    for r in range(runs):
        b = run_block[r]
        fds = files.pair_fds[files.pair_first[b]:files.pair_first[b + 1]]
        if not read_span(fds, files.pair_rows[b], 8, run_lo[r], run_hi[r] - run_lo[r], stage, 2 * run_at[r], 2):
            raise CorruptDatasetError("reading a partition's packed pairs came back short (a truncated chunk file or "
                                      "a failing disk); run `graphstore verify` on the dataset")
    shift = np.zeros(nf, np.int64)
    for t in range(nf):
        r = run_of[t]
        if r >= 0:
            at = run_at[r] + starts[t] - run_lo[r]
            shift[order[t]] = starts[t] - at
            starts[t] = at
    return stage, shift


@njit(cache=True, nogil=True)
def shift_positions(pos, col, f_lo, shift, e_lo, e_hi):
    """The picks ``[e_lo, e_hi)``'s buffer positions as CSC positions (``col``: each pick's frontier position)."""
    for x in range(e_lo, e_hi):
        pos[x] += shift[col[x] - f_lo]
