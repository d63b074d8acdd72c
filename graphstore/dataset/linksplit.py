"""Link splits: every edge of one edge type is train, validation or test, both directions of a pair alike."""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphstore.errors import InvalidInputError

logger = logging.getLogger(__name__)

TRAIN, VAL, TEST = 0, 1, 2
SPLIT_NAMES = ("train", "val", "test")
SPLIT_BY = ("random", "time")
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_BLOCK = 1 << 22


@dataclass(frozen=True)
class LinkSplit:
    """How to split the links of ``edge_type`` (``None``: the only, or first, edge type).

    ``fractions`` (train, val, test) are non-negative and sum to 1. ``by="random"`` draws each pair
    from a hash of its two input node IDs and ``seed`` (deterministic, no state); ``by="time"`` cuts at
    the global quantiles of the edge attribute ``time_attr`` (ties go to the earlier split). A pair is
    an edge and its reverse (and any duplicates): key ``(min(u, v), max(u, v))`` when both ends have
    the same node type, else ``(u, v)``; all its edges get one split (by time: the pair's earliest).

    Examples
    --------
    >>> LinkSplit((0.8, 0.1, 0.1), by="time").fractions
    (0.8, 0.1, 0.1)
    """

    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    by: str = "random"
    edge_type: Any = None
    seed: int = 0
    time_attr: str = "time"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", check_fractions(self.fractions))
        if self.by not in SPLIT_BY:
            raise InvalidInputError(f"link split by {self.by!r}: use one of {SPLIT_BY}")
        if self.edge_type is not None:
            name = (self.edge_type,) if isinstance(self.edge_type, str) else tuple(self.edge_type)
            object.__setattr__(self, "edge_type", name)
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
            raise InvalidInputError(f"link split seed {self.seed!r} must be an integer")

    def describe(self) -> dict[str, Any]:
        """The manifest's record of this rule (counts are added by the writer)."""
        out = {"by": self.by, "fractions": list(self.fractions), "seed": int(self.seed)}
        return {**out, "time_attr": self.time_attr} if self.by == "time" else out


def check_fractions(value: Any) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` or three numbers → a validated (train, val, test) tuple."""
    text = value if isinstance(value, str) else None
    try:
        parts = [float(v) for v in (value.split(",") if text is not None else value)]
    except (TypeError, ValueError):
        parts = []
    if len(parts) != 3 or not all(math.isfinite(v) and v >= 0 for v in parts) or abs(sum(parts) - 1) > 1e-6:
        raise InvalidInputError(
            f"link split {value!r}: give three non-negative fractions train,val,test summing to 1, e.g. 0.8,0.1,0.1"
        )
    return (parts[0], parts[1], parts[2])


def _pair_keys(src: np.ndarray, dst: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    return (np.minimum(src, dst), np.maximum(src, dst)) if symmetric else (src, dst)


def _uniform(lo: np.ndarray, hi: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per pair: splitmix64 of the pair and the seed (numpy, vectorised)."""
    out = np.empty(len(lo), np.float64)
    salt = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64)
    with np.errstate(over="ignore"):
        for start in range(0, len(lo), _BLOCK):
            a = lo[start: start + _BLOCK].astype(np.uint64)
            b = hi[start: start + _BLOCK].astype(np.uint64)
            z = (a * np.uint64(0x9E3779B97F4A7C15)) ^ b ^ salt
            for _ in range(2):  # two rounds: a and b both reach every output bit
                z = (z ^ (z >> np.uint64(30))) * _MIX1
                z = (z ^ (z >> np.uint64(27))) * _MIX2
                z = z ^ (z >> np.uint64(31))
            out[start: start + len(a)] = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return out


def time_cuts(times: np.ndarray, fractions: tuple[float, float, float]) -> tuple[float, float]:
    """The two cut times: an edge is train up to the first, validation up to the second, else test."""
    times = np.asarray(times, np.float64)
    head = fractions[0] + fractions[1]
    cut1 = -math.inf if fractions[0] <= 0 or not len(times) else float(np.quantile(times, fractions[0], method="lower"))
    cut2 = -math.inf if head <= 0 or not len(times) else float(np.quantile(times, min(head, 1.0), method="lower"))
    return cut1, (math.inf if head >= 1 - 1e-12 else cut2)


def assign(src: np.ndarray, dst: np.ndarray, times: np.ndarray | None, rule: LinkSplit, symmetric: bool
           ) -> tuple[np.ndarray, dict[str, Any]]:
    """The split (int8: 0 train, 1 val, 2 test) of every edge ``src[i] -> dst[i]`` (input IDs), and
    what was decided (the time cuts, for ``by="time"``)."""
    lo, hi = _pair_keys(src, dst, symmetric)
    if rule.by == "random":
        bounds = np.cumsum(rule.fractions)[:2]
        return np.searchsorted(bounds, _uniform(lo, hi, rule.seed), side="right").astype(np.int8), {}
    if times is None:
        raise InvalidInputError(f"a time split needs the edge attribute {rule.time_attr!r}")
    times = np.asarray(times, np.float64).reshape(len(lo))
    order = np.lexsort((hi, lo))
    first = np.ones(len(order), bool)
    first[1:] = (lo[order][1:] != lo[order][:-1]) | (hi[order][1:] != hi[order][:-1])
    starts = np.flatnonzero(first)
    pair_time = np.empty(len(order), np.float64)
    if len(order):
        earliest = np.minimum.reduceat(times[order], starts)
        pair_time[order] = np.repeat(earliest, np.diff(np.append(starts, len(order))))
    cut1, cut2 = time_cuts(times, rule.fractions)
    split = np.where(pair_time <= cut1, TRAIN, np.where(pair_time <= cut2, VAL, TEST)).astype(np.int8)
    return split, {"cuts": [c if math.isfinite(c) else None for c in (cut1, cut2)]}  # JSON has no inf


def counts(split: np.ndarray) -> dict[str, int]:
    """``{"train": n, "val": n, "test": n}``."""
    found = np.bincount(np.asarray(split, np.int64), minlength=3)
    return {name: int(found[i]) for i, name in enumerate(SPLIT_NAMES)}


def check_edge_type(rule: LinkSplit, edge_types: list[Any], num_edges: dict[Any, int],
                    edge_attrs: dict[Any, list[str]], where: str) -> Any:
    """The edge type ``rule`` splits (as the graph names it), validated: it exists, has edges and,
    for a time split, the time attribute."""
    etype = _find_edge_type(rule.edge_type, edge_types, where)
    if num_edges[etype] == 0:
        raise InvalidInputError(f"{where}: edge type {etype!r} has no edges to split; pick one with edges")
    if rule.by == "time" and rule.time_attr not in edge_attrs[etype]:
        raise InvalidInputError(
            f"{where}: a time split needs the edge attribute {rule.time_attr!r} on edge type {etype!r}, which has "
            f"{sorted(edge_attrs[etype])}; split by random or name the time attribute"
        )
    return etype


def _find_edge_type(name: Any, edge_types: list[Any], where: str) -> Any:
    if name is None:
        return edge_types[0] if edge_types else None
    for etype in edge_types:
        if etype is not None and (tuple(etype) == tuple(name) or (len(name) == 1 and etype[1] == name[0])):
            return etype
    raise InvalidInputError(f"{where}: edge type {name!r} is not in the graph; it has {edge_types}")


def log_computed(rule: LinkSplit, where: str) -> None:
    logger.warning("%s has no stored link split: making one by %s, fractions %s, seed %d (the rules of "
                   "`graphstore ingest --link-split`; store one there to skip this)",
                   where, rule.by, ",".join(map(str, rule.fractions)), rule.seed)
