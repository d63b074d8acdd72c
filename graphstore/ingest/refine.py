"""Balanced refinement of a partition: vertices move to the part most of their edge weight leads to.

Label propagation, in rounds: every vertex proposes the other part most of its edge weight leads to
(a graph on disk: one task per bucket; in memory: one pass), and the client applies the proposals
best gain first while no part passes the balance target in any constraint. It runs on every level of
a coarsened graph on the way back down (``coarsen.py``), and after METIS on a whole graph.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from numba import njit

from graphstore.ingest.adjacency import Level
from graphstore.ingest.coarsen import SETTLED
from graphstore.ingest.engine import Engine, Progress
from graphstore.ingest.scratch import Scratch, StoredArray

logger = logging.getLogger(__name__)

REFINE_ROUNDS = 20  # refinement rounds per level at most


@njit(cache=True)
def _propose(indptr, adjncy, adjwgt, lo, parts, over, target, gain):  # pragma: no cover - numba
    """For each vertex, the other part most of its edge weight leads to, and the gain of moving there
    (edge weight there less edge weight at home). Vertices propose a move when it gains, or, in a part
    that is ``over`` its cap, whatever it costs (-inf: no other part to go to)."""
    num_parts = len(over)
    counts = np.zeros(num_parts, np.float64)
    for i in range(len(indptr) - 1):
        own = parts[lo + i]
        counts[:] = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            counts[parts[adjncy[k]]] += 1.0 if adjwgt.shape[0] == 0 else adjwgt[k]
        target[i], gain[i] = own, -np.inf
        for p in range(num_parts):
            if p != own and counts[p] - counts[own] > gain[i]:
                target[i], gain[i] = p, counts[p] - counts[own]
        if gain[i] <= 0 and not over[own]:
            target[i], gain[i] = own, -np.inf


@njit(cache=True)
def _accept(movers, target, gain, weight, parts, load, cap, passes):  # pragma: no cover - numba
    """Apply proposed moves, best gain first (``movers`` in that order, ``weight[j]`` the weights of
    ``movers[j]``), each only while its target part stays within ``cap`` in every constraint; a move that
    loses edge weight only while its own part is still over ``cap``. Later passes take moves that earlier
    departures made room for (so parts can trade vertices). Returns how many moved."""
    done = np.zeros(len(movers), np.bool_)
    moved = 0
    for _ in range(passes):
        before = moved
        for j in range(len(movers)):
            if done[j]:
                continue
            v, b = movers[j], target[j]
            a = parts[v]
            fits, needed = True, gain[j] > 0
            for c in range(load.shape[1]):
                if load[b, c] + weight[j, c] > cap[c]:
                    fits = False
                if load[a, c] > cap[c] and weight[j, c] > 0:
                    needed = True
            if fits and needed:
                for c in range(load.shape[1]):
                    load[b, c] += weight[j, c]
                    load[a, c] -= weight[j, c]
                parts[v] = b
                done[j] = True
                moved += 1
        if moved == before:
            break
    return moved


def propose_stream(buckets: range, *, scratch: Scratch, level: Level, parts: StoredArray, over: np.ndarray,
                   vweights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stage ``refine``: the moves a run of buckets' vertices propose, as (vertices, target parts, gains, the
    vertices' weights). ``vweights``: every vertex's, or None for a level whose buckets hold them."""
    found, parts = [], parts.mapped()
    for bucket in buckets:
        indptr, adjncy, adjwgt = level.piece(scratch, bucket)
        lo = int(level.bounds[bucket])
        target, gain = np.empty(len(indptr) - 1, parts.dtype), np.empty(len(indptr) - 1, np.float64)
        _propose(indptr, adjncy, np.zeros(0) if adjwgt is None else adjwgt, lo, parts, over, target, gain)
        keep = np.flatnonzero(gain > -np.inf)
        rows = level.vertex_weights(scratch, bucket) if vweights is None else vweights[lo: lo + len(target)]
        found.append(((keep + lo).astype(parts.dtype), target[keep], gain[keep].astype(np.float32), rows[keep]))
    if not found:
        return (np.zeros(0, parts.dtype), np.zeros(0, parts.dtype), np.zeros(0, np.float32),
                np.zeros((0, 0 if vweights is None else vweights.shape[1]), np.int64))
    return tuple(np.concatenate([f[k] for f in found]) for k in range(4))


def refine_parts(engine: Engine, scratch: Scratch, level: Level, parts: np.ndarray, weights: np.ndarray | None,
                 load: np.ndarray, num_parts: int, target: float, progress: Progress | None = None) -> int:
    """Balanced label-propagation refinement of ``parts`` (in place) on a graph on disk: in each round every
    vertex proposes the part most of its edge weight leads to (the streams in parallel), and the client
    applies the proposals best gain first while no constraint's load passes ``target`` times its mean;
    vertices of a part over that leave it, least loss first, until it is not. ``weights``: every vertex's,
    or None when the level's buckets hold them; ``load``: each part's load in each constraint, kept up to
    date. Returns the moves made."""
    def proposals(over: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        stored = scratch.put_array(f"{level.prefix}.parts.npy", parts)
        found = engine.map("refine", propose_stream, [range(b, b + 1) for b in range(level.buckets)], progress,
                           None, scratch=scratch, level=level, parts=stored, over=over, vweights=weights)
        stored.remove()
        return tuple(np.concatenate([f[k] for f in found]) for k in range(4))
    return _refine_rounds(proposals, parts, load, num_parts, target)


def refine_graph(xadj: np.ndarray, adjncy: np.ndarray, parts: np.ndarray, weights: np.ndarray, num_parts: int,
                 target: float, adjwgt: np.ndarray | None = None) -> int:
    """:func:`refine_parts` on a graph in memory (edge weights ``adjwgt``, or 1); returns the moves made."""
    def proposals(over: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        node_target, gain = np.empty_like(parts), np.empty(len(parts), np.float64)
        _propose(xadj, adjncy, np.zeros(0) if adjwgt is None else adjwgt.astype(np.float64), 0, parts, over,
                 node_target, gain)
        keep = np.flatnonzero(gain > -np.inf)
        return keep, node_target[keep], gain[keep], weights[keep]
    load = np.stack([np.bincount(parts, weights=weights[:, c], minlength=num_parts)
                     for c in range(weights.shape[1])], axis=1)
    return _refine_rounds(proposals, parts, load, num_parts, target)


def _refine_rounds(proposals: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
                   parts: np.ndarray, load: np.ndarray, num_parts: int, target: float) -> int:
    """Rounds of proposals and their acceptance; ``load`` (parts x constraints, float64) follows every move."""
    cap = load.sum(axis=0) / num_parts * (target - 1e-9)  # strictly within target, rounding included
    moves = 0
    for _ in range(REFINE_ROUNDS):
        movers, to, gain, weight = proposals((load > cap[None, :]).any(axis=1))
        order = np.argsort(-gain, kind="stable")
        changed = int(_accept(movers[order], to[order], gain[order], weight[order].astype(np.float64), parts, load,
                              cap, 4))
        moves += changed
        logger.debug("refinement round: %d of %d vertices moved", changed, len(parts))
        if changed < SETTLED * len(parts) / 20:
            break
    return moves
