"""Seeded synthetic graphs: power-law degrees, planted communities and lazily computed features."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.validate import BYTES_PER_EDGE, check_fits_memory


SCHEME = "synthetic"

# what each key accepts, quoted in every spec error
ACCEPTED_KEYS: dict[str, str] = {
    "nodes": "integer >= 2 (required)",
    "avg_degree": "number > 0, average in-degree of the stored directed edges (default 10)",
    "features": "integer >= 0, 0 means no x (default 64)",
    "classes": "integer >= 2 (default 8)",
    "seed": "integer in [0, 2**63) (default 0)",
    "train": "fraction in [0, 1], train + val <= 1 (default 0.6)",
    "val": "fraction in [0, 1], train + val <= 1 (default 0.2)",
    "homophily": "fraction in [0, 1] of edges inside a community (default 0.8)",
    "noise": "number >= 0, scale of the feature noise (default 1.0)",
}

_INT_KEYS = frozenset({"nodes", "features", "classes", "seed"})
COMMUNITIES_PER_CLASS = 4
PARETO_SHAPE = 2.0  # tail exponent of the degree weights: finite mean, infinite variance
CENTROID_SCALE = 2.0  # class-centroid distance in noise units; ~70% linear accuracy at defaults
EDGES_PER_STEP = 1 << 22  # undirected edges drawn per vectorized step
_TAKE_BLOCK = 1 << 20  # feature values computed per vectorized step

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# four 16-bit uniforms summed (Irwin-Hall): mean 4 * 65535 / 2, variance ~ 4 * 65536**2 / 12
_IH_CENTER = 131070
_IH_SCALE = np.float32(math.sqrt(3.0) / 65536.0)


def _accepted() -> str:
    return "; ".join(f"{key}: {help_}" for key, help_ in ACCEPTED_KEYS.items())


def _bad(key: str, value: object, why: str) -> InvalidInputError:
    return InvalidInputError(f"synthetic spec: {key}={value!r} is invalid ({why}); accepted keys: {_accepted()}")


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic graph, validated on construction.

    Parameters
    ----------
    nodes : int
        Number of nodes, at least 2.
    avg_degree : float
        Average in-degree of the stored directed edge list (both directions of every edge).
    features : int
        Width of ``x``; 0 leaves ``x`` out.
    classes : int
        Number of labels; each label owns several planted communities.
    seed : int
        Seed of everything random: edges, labels, masks and features.
    train, val : float
        Split fractions; the remaining nodes are test nodes.
    homophily : float
        Probability that an edge stays inside the community of its first endpoint.
    noise : float
        Standard deviation of the per-value feature noise around the class centroid.

    Examples
    --------
    >>> SyntheticSpec(nodes=1000, classes=4).avg_degree
    10.0
    """

    nodes: int
    avg_degree: float = 10.0
    features: int = 64
    classes: int = 8
    seed: int = 0
    train: float = 0.6
    val: float = 0.2
    homophily: float = 0.8
    noise: float = 1.0

    def __post_init__(self) -> None:
        coerce_fields(self, _INT_KEYS, _bad)
        self._check_ranges()

    def _check_ranges(self) -> None:
        checks = [
            ("nodes", self.nodes >= 2),
            ("avg_degree", self.avg_degree > 0),
            ("features", self.features >= 0),
            ("classes", self.classes >= 2),
            ("seed", 0 <= self.seed < 2**63),
            ("train", 0.0 <= self.train <= 1.0),
            ("val", 0.0 <= self.val <= 1.0),
            ("homophily", 0.0 <= self.homophily <= 1.0),
            ("noise", self.noise >= 0),
        ]
        for key, ok in checks:
            if not ok:
                raise _bad(key, getattr(self, key), f"out of range, expected {ACCEPTED_KEYS[key]}")
        if self.train + self.val > 1.0 + 1e-9:
            raise _bad("train", self.train, f"train + val = {self.train + self.val:g} exceeds 1")
        if self.classes > self.nodes:
            raise _bad("classes", self.classes, f"more classes than nodes ({self.nodes}); every class needs nodes: "
                       f"give classes <= nodes")
        check_fits_memory(f"synthetic spec: {self.num_edges:,} edges (nodes x avg_degree)",
                          self.num_edges * BYTES_PER_EDGE, "lower nodes= or avg_degree=")

    @property
    def num_edges(self) -> int:
        """Number of stored directed edges: twice the undirected count, so always even."""
        return 2 * round(self.nodes * self.avg_degree / 2)

    def to_string(self) -> str:
        """The canonical SOURCE string, every key spelled out, that parses back to this spec."""
        parts = ",".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{SCHEME}:{parts}"


def coerce_fields(spec: object, int_keys: frozenset[str], bad: Callable[[str, object, str], Exception]) -> None:
    """Make every field of a frozen spec dataclass an int (``int_keys``) or a finite float, or raise ``bad``."""
    for f in fields(spec):  # type: ignore[arg-type]
        value = getattr(spec, f.name)
        if f.name in int_keys:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise bad(f.name, value, "not an integer")
            object.__setattr__(spec, f.name, int(value))
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise bad(f.name, value, "not a finite number")
            object.__setattr__(spec, f.name, float(value))


def parse_pairs(spec: str, scheme: str, accepted: dict[str, str], int_keys: frozenset[str],
                required: str) -> dict[str, int | float]:
    """The ``key=value`` pairs of a generator's SOURCE spec (the ``scheme:`` prefix is optional), each
    key checked against ``accepted`` and parsed as an int (``2.4e6`` allowed) or a float."""
    listing = "; ".join(f"{key}: {help_}" for key, help_ in accepted.items())
    body = spec.strip()
    if body.startswith(f"{scheme}:"):
        body = body[len(scheme) + 1:]
    values: dict[str, int | float] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or not key or not raw:
            raise InvalidInputError(f"{scheme} spec: {item!r} is not key=value; accepted keys: {listing}")
        if key not in accepted:
            raise InvalidInputError(f"{scheme} spec: unknown key {key!r}; accepted keys: {listing}")
        if key in values:
            raise InvalidInputError(f"{scheme} spec: key {key!r} given twice in {spec!r}; give it once")
        values[key] = _number(raw, key in int_keys, f"{scheme} spec: {key}={raw!r} is invalid", listing)
    if required not in values:
        raise InvalidInputError(f"{scheme} spec {spec!r} lacks the required key {required!r}; accepted keys: {listing}")
    return values


def _number(raw: str, integer: bool, where: str, listing: str) -> int | float:
    try:
        if not integer:
            return float(raw)
        number = float(raw)  # "2.4e6" is an integer written as a float
        if not number.is_integer():
            raise ValueError(raw)
        return int(raw) if raw.lstrip("+-").isdigit() else int(number)
    except (ValueError, OverflowError):
        why = "not an integer" if integer else "not a number"
        raise InvalidInputError(f"{where} ({why}); accepted keys: {listing}") from None


def parse_synthetic_spec(spec: str) -> SyntheticSpec:
    """Parse ``"nodes=N,avg_degree=D,..."`` (optionally prefixed by ``"synthetic:"``).

    Parameters
    ----------
    spec : str
        Comma-separated ``key=value`` pairs; see :data:`ACCEPTED_KEYS`. ``nodes`` is required.

    Returns
    -------
    SyntheticSpec
        The validated parameters, defaults filled in.

    Raises
    ------
    InvalidInputError
        On an unknown, repeated or missing key, a malformed pair or an out-of-range value.

    Examples
    --------
    >>> parse_synthetic_spec("synthetic:nodes=100,classes=3,seed=7").classes
    3
    """
    values = parse_pairs(spec, SCHEME, ACCEPTED_KEYS, _INT_KEYS, required="nodes")
    return SyntheticSpec(**values)  # type: ignore[arg-type]


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def _unit_noise(bits: np.ndarray) -> np.ndarray:
    """Mean-0, variance-1 float32 noise from uint64 hashes: the sum of their four 16-bit fields.

    Only integer sums and one exact float32 scaling, so a value never depends on the batch it was
    computed in (no SIMD-dependent transcendental functions).
    """
    fields16 = bits.view(np.uint16).reshape(*bits.shape, 4)
    total = fields16[..., 0].astype(np.int32)
    for i in (1, 2, 3):
        total += fields16[..., i]
    total -= _IH_CENTER
    noise = total.astype(np.float32)
    noise *= _IH_SCALE
    return noise


class SyntheticFeatures:
    """The ``x`` of a synthetic graph as a :class:`~graphstore.ingest.source.RowSource`, computed on demand.

    Value ``(i, j)`` is ``centroid[y[i], j] + noise * h(key, i, j)`` where ``h`` is unit-variance
    noise from a splitmix64 hash of the seed-derived key and the counter ``i * features + j``, so
    a row is the same whichever batch asks for it. Nothing of size ``nodes * features`` is stored.

    Examples
    --------
    >>> from graphstore.ingest.synthetic_chunks import synthetic_graph
    >>> feats = synthetic_graph(parse_synthetic_spec("nodes=50,features=4")).nodes[None].attrs["x"]
    >>> bool((feats.take(np.array([7])) == feats.take(np.arange(50))[7]).all())
    True
    """

    def __init__(self, labels: np.ndarray, centroids: np.ndarray, key: int, noise: float) -> None:
        self._labels = np.asarray(labels, dtype=np.int64)
        self._centroids = np.ascontiguousarray(centroids, dtype=np.float32)
        self._key = np.uint64(key)
        self._noise = np.float32(noise)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self._labels), self._centroids.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) as a float32 array of shape ``(len(rows), features)``."""
        rows = np.asarray(rows)
        if rows.ndim != 1 or not (rows.size == 0 or np.issubdtype(rows.dtype, np.integer)):
            raise InvalidInputError(
                f"synthetic features: rows must be a 1-D integer array, got dtype {rows.dtype} shape {rows.shape}"
            )
        n, width = self.shape
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise InvalidInputError(
                f"synthetic features: row IDs must lie in [0, {n}), got min {rows.min()} max {rows.max()}"
            )
        rows = rows.astype(np.int64, copy=False)
        out = np.empty((len(rows), width), dtype=np.float32)
        step = max(1, _TAKE_BLOCK // max(width, 1))
        for lo in range(0, len(rows), step):
            out[lo : lo + step] = self._rows(rows[lo : lo + step])
        return out

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        return feature_rows(rows, self._labels[rows], self._centroids, self._key, self._noise)


def feature_rows(rows: np.ndarray, labels: np.ndarray, centroids: np.ndarray, key: np.uint64,
                 noise_scale: np.float32) -> np.ndarray:
    """``x`` of nodes ``rows`` (int64) whose labels are ``labels``: centroid plus hashed unit noise."""
    width = centroids.shape[1]
    counter = rows.astype(np.uint64)[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)
    counter *= GOLDEN
    counter += np.uint64(key)
    noise = _unit_noise(mix64(counter))
    noise *= np.float32(noise_scale)
    noise += centroids[labels]
    return noise


def search_sorted(cumw: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``searchsorted(cumw, keys, side="right")``, searched in key order for cache locality (~5x faster)."""
    perm = np.argsort(keys)
    pos = np.empty(len(keys), dtype=np.int64)
    pos[perm] = np.searchsorted(cumw, keys[perm], side="right")
    return pos


@dataclass(frozen=True)
class Communities:
    """Nodes grouped by community with cumulative degree weights, for weighted sampling."""

    community: np.ndarray | None  # community of each node (None: not kept, sampling needs only the rest)
    order: np.ndarray  # node IDs sorted by community (int32 below 2**31 nodes)
    cumw: np.ndarray  # cumulative weight along ``order``
    start: np.ndarray  # first position of each community in ``order``
    end: np.ndarray  # one past its last position
    base: np.ndarray  # ``cumw`` just before ``start``
    mass: np.ndarray  # total weight of each community

    @classmethod
    def build(cls, community: np.ndarray, weights: np.ndarray, count: int, keep_community: bool = True
              ) -> Communities:
        """The tables of nodes in ``community`` (``0..count-1``) with degree ``weights``.

        Holds 12 bytes a node (``order``, ``cumw``), and ``community`` when kept.
        """
        order = np.argsort(community, kind="stable")
        order = order.astype(np.int32) if len(order) < 2**31 else order
        cumw = weights[order]
        np.cumsum(cumw, out=cumw)
        bounds = np.zeros(count + 1, np.int64)
        np.cumsum(np.bincount(community, minlength=count)[:count], out=bounds[1:])
        before = np.where(bounds > 0, cumw[np.maximum(bounds - 1, 0)], 0.0)  # cumw just before each bound
        return cls(community if keep_community else None, order, cumw, bounds[:-1], bounds[1:], before[:-1],
                   before[1:] - before[:-1])

    def sample_pairs(self, rng: np.random.Generator, count: int, homophily: float) -> tuple[np.ndarray, np.ndarray]:
        """``count`` undirected edges: a weighted node, then a weighted partner (own community w.p. ``homophily``)."""
        total, last = self.cumw[-1], len(self.order) - 1
        first = np.minimum(search_sorted(self.cumw, rng.random(count) * total), last)
        u = self.order[first].astype(np.int64)
        cu = np.searchsorted(self.end, first, side="right")  # the community of position ``first`` of ``order``
        inside = rng.random(count) < homophily
        r = rng.random(count)
        target = np.where(inside, self.base[cu] + r * self.mass[cu], r * total)
        pos = search_sorted(self.cumw, target)
        # float rounding at a community's upper edge must not leak into the next community
        pos = np.clip(pos, np.where(inside, self.start[cu], 0), np.where(inside, self.end[cu] - 1, last))
        return u, self.order[pos].astype(np.int64)
