"""Measure multi-constraint partition balance and repair a split by moving boundary nodes."""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

TARGET = 1.05  # every constraint's max / mean load at most this
# repair runs compared, as (start with targeted rounds, targeted rounds swap): cut-keeping moves
# first, then targeted swaps; targeted one-way moves only; targeted swaps only
STRATEGIES = ((False, True), (True, False), (True, True))


def part_loads(parts: np.ndarray, weights: np.ndarray, num_parts: int) -> np.ndarray:
    """The (num_parts, constraints) total weight each part holds of each constraint."""
    return np.stack([np.bincount(parts, weights=weights[:, c], minlength=num_parts)
                     for c in range(weights.shape[1])], axis=1)


def imbalance(loads: np.ndarray) -> np.ndarray:
    """Per constraint: the heaviest part's load over the mean load (1.0 for a constraint with no weight)."""
    mean = loads.mean(axis=0)
    return np.where(mean > 0, loads.max(axis=0) / np.where(mean > 0, mean, 1.0), 1.0)


def rebalance(parts: np.ndarray, weights: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, num_parts: int,
              target: float = TARGET, max_rounds: int | None = None) -> int:
    """Move nodes from the heaviest part to the lightest until every constraint is within ``target``.

    Each round takes the constraint and part furthest over the mean, and moves that part's nodes
    carrying the constraint to the part lightest in it, nodes with the most neighbours in the target
    part (and fewest at home) first among those carrying the constraint rather than the others, just
    enough to close half the gap. A round whose move does not
    lower the worst imbalance is halved, then given up; when cut-keeping moves stall, targeted rounds
    move nodes carrying the constraint first, and may swap (see ``_round``). The runs of
    ``STRATEGIES`` are compared: the balanced one with the smaller cut wins. ``parts`` is changed in place; the count of
    moved nodes is returned. ``xadj``/``adjncy``: the symmetric CSR METIS saw (a sample is fine).

    Examples
    --------
    >>> parts = np.array([0, 0, 0, 1]); w = np.ones((4, 1), np.int64)
    >>> xadj, adj = np.array([0, 1, 2, 3, 3]), np.array([1, 0, 3])
    >>> rebalance(parts, w, xadj, adj, 2), np.bincount(parts).tolist()
    (1, [2, 2])
    """
    best = None
    for strategy in STRATEGIES:
        trial = parts.copy()
        moved = _repair(trial, weights, xadj, adjncy, num_parts, target, strategy, max_rounds)
        worst = imbalance(part_loads(trial, weights, num_parts)).max()
        score = (max(worst, target), edge_cut(trial, xadj, adjncy))
        if best is None or score < best[0]:
            best = (score, trial, moved)
        if worst <= target and moved == 0:
            break
    parts[:] = best[1]
    return best[2]


def edge_cut(parts: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray) -> int:
    """Adjacency entries (directed edges) whose endpoints lie in different parts."""
    return int(np.count_nonzero(np.repeat(parts, np.diff(xadj)) != parts[adjncy]))


def _repair(parts: np.ndarray, weights: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, num_parts: int,
            target: float, strategy: tuple[bool, bool], max_rounds: int | None) -> int:
    targeted, swap = strategy
    loads = part_loads(parts, weights, num_parts)
    moved, rounds = 0, max_rounds if max_rounds is not None else 64 * num_parts + 256
    for _ in range(rounds):
        worst = imbalance(loads)
        if worst.max() <= target:
            break
        step = 0
        for c in np.argsort(-worst)[: int(np.count_nonzero(worst > target))]:  # worst first; next if stuck
            step = _round(parts, weights, xadj, adjncy, loads, int(c), targeted, swap)
            if step:
                break
        if step == 0 and targeted:
            break
        targeted |= step == 0
        moved += step
    return moved


def _round(parts: np.ndarray, weights: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, loads: np.ndarray,
           c: int, targeted: bool, swap: bool) -> int:
    """One move for constraint ``c`` from its heaviest part to its lightest; 0 when no move helps.

    Targeted rounds also move nodes back, carrying the constraint the receiving part is most over in
    (a swap: hubs one way, leaves the other, when nodes and edges pull apart).
    """
    heavy, light = int(loads[:, c].argmax()), int(loads[:, c].argmin())
    mean = loads.mean(axis=0)
    wanted = min(loads[heavy, c] - mean[c], (loads[heavy, c] - loads[light, c]) / 2)
    there = _ordered(parts, weights, xadj, adjncy, loads, c, heavy, light, targeted)
    if wanted <= 0 or len(there) == 0:
        return 0
    take = _prefix(weights[there, c], wanted)
    back, take_back = there[:0], 0
    if targeted and swap:
        over = loads[light] / np.maximum(mean, 1e-12)
        over[c] = 0.0
        c2 = int(over.argmax())
        excess = loads[light, c2] + weights[there[:take], c2].sum() - mean[c2]
        if excess > 0:
            back = _ordered(parts, weights, xadj, adjncy, loads, c2, light, heavy, True)
            take_back = _prefix(weights[back, c2], excess) if len(back) else 0
    return _apply(parts, weights, loads, (heavy, there, take), (light, back, take_back))


def _score(loads: np.ndarray) -> tuple[float, float]:
    """What a move must lower: the worst imbalance, then the squared overloads of every part (ties)."""
    ratio = loads / np.maximum(loads.mean(axis=0), 1e-12)
    return float(ratio.max()), float(np.square(np.clip(ratio - 1.0, 0.0, None)).sum())


def _prefix(weights: np.ndarray, amount: float) -> int:
    """How many of ``weights``, in order, first reach ``amount`` (all of them at most)."""
    return min(int(np.searchsorted(np.cumsum(weights), amount, side="right")) + 1, len(weights))


def _apply(parts: np.ndarray, weights: np.ndarray, loads: np.ndarray, out: tuple, back: tuple) -> int:
    """Move the first ``take`` of ``out``'s nodes to ``back``'s part and vice versa, halving both until
    the score drops (the worst imbalance, then the overloads); the count moved (0: none helped)."""
    (a, nodes_a, take_a), (b, nodes_b, take_b) = out, back
    before = _score(loads)
    while take_a > 0:
        delta = weights[nodes_a[:take_a]].sum(axis=0) - weights[nodes_b[:take_b]].sum(axis=0)
        trial = loads.copy()
        trial[a] -= delta
        trial[b] += delta
        if _score(trial) < before:
            parts[nodes_a[:take_a]] = b
            parts[nodes_b[:take_b]] = a
            loads[:] = trial
            return take_a + take_b
        take_a, take_b = take_a // 2, take_b // 2
    return 0


def _ordered(parts: np.ndarray, weights: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, loads: np.ndarray,
             c: int, home: int, target: int, targeted: bool) -> np.ndarray:
    """``home``'s nodes carrying ``c`` (untargeted: boundary to ``target`` only, if any), best move first.

    Untargeted: most neighbours gained first, nodes carrying ``c`` rather than the rest breaking ties;
    targeted: the reverse priority.
    """
    candidates = np.flatnonzero((parts == home) & (weights[:, c] > 0))
    there, stay = _links(parts, xadj, adjncy, candidates, home, target)
    boundary = there > 0
    if boundary.any() and not targeted:  # peel the boundary round by round: gains are recomputed after every move
        candidates, there, stay = candidates[boundary], there[boundary], stay[boundary]
    keys = (stay - there, -_efficiency(weights[candidates], loads, c))
    return candidates[np.lexsort(keys if targeted else keys[::-1])]


def _efficiency(weights: np.ndarray, loads: np.ndarray, c: int) -> np.ndarray:
    """Per node: 1 when its share of constraint ``c`` is at least its share of every other constraint, else 0.

    Moving nodes that carry ``c`` rather than the others (a hub to shed edges, a leaf to shed nodes)
    fixes ``c`` without unbalancing the rest.
    """
    share = weights / np.maximum(loads.mean(axis=0), 1e-12)
    others = np.delete(share, c, axis=1)
    rest = others.max(axis=1) if others.shape[1] else np.zeros(len(share))
    return (share[:, c] >= rest).astype(np.int64)


def _links(parts: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, nodes: np.ndarray, home: int,
           target: int) -> tuple[np.ndarray, np.ndarray]:
    """Per node: its neighbours in ``target`` and in ``home`` (a move saves the first, cuts the second)."""
    owner = parts[adjncy]
    out = []
    for part in (target, home):
        prefix = np.zeros(len(adjncy) + 1, np.int64)
        np.cumsum(owner == part, out=prefix[1:])
        out.append(prefix[xadj[nodes + 1]] - prefix[xadj[nodes]])
    return out[0], out[1]
