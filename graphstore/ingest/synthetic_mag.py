"""Seeded ogbn-mag-shaped heterogeneous graphs: papers, authors, institutions and fields with planted venues."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.ingest.synthetic import (EDGES_PER_STEP, PARETO_SHAPE, SyntheticFeatures, Communities, search_sorted,
                                        coerce_fields, parse_pairs)
from graphstore.dataset.types import EdgeType

logger = logging.getLogger(__name__)

SCHEME = "synthetic-mag"

PAPER, AUTHOR, INSTITUTION, FIELD = "paper", "author", "institution", "field_of_study"
WRITES: EdgeType = (AUTHOR, "writes", PAPER)
CITES: EdgeType = (PAPER, "cites", PAPER)
AFFILIATED_WITH: EdgeType = (AUTHOR, "affiliated_with", INSTITUTION)
HAS_TOPIC: EdgeType = (PAPER, "has_topic", FIELD)
# the reverse edge types PyG's ToUndirected adds to ogbn-mag (``cites`` joins papers to papers: no reverse type)
REVERSE: dict[EdgeType, EdgeType] = {
    WRITES: (PAPER, "rev_writes", AUTHOR),
    AFFILIATED_WITH: (INSTITUTION, "rev_affiliated_with", AUTHOR),
    HAS_TOPIC: (FIELD, "rev_has_topic", PAPER),
}

# ogbn-mag's real sizes (21,111,007 edges in all); every count scales with ``papers``
OGBN_MAG_NODES: dict[str, int] = {PAPER: 736_389, AUTHOR: 1_134_649, INSTITUTION: 8_740, FIELD: 59_965}
OGBN_MAG_EDGES: dict[EdgeType, int] = {AFFILIATED_WITH: 1_043_998, WRITES: 7_145_660, CITES: 5_416_271,
                                        HAS_TOPIC: 7_505_078}

ACCEPTED_KEYS: dict[str, str] = {
    "papers": "integer >= 2 (required); every other count scales with it like ogbn-mag (736,389 papers)",
    "seed": "integer in [0, 2**63) (default 0)",
    "features": "integer >= 0, width of the paper features x, 0 means no x (default 128)",
    "classes": "integer >= 2, number of venues y (default 349)",
    "train": "fraction in [0, 1] of papers, the oldest ones; train + val <= 1 (default 0.6)",
    "val": "fraction in [0, 1] of papers, the next oldest; train + val <= 1 (default 0.2)",
    "homophily": "fraction in [0, 1] of edges inside the venue community of their first end (default 0.8)",
    "noise": "number >= 0, scale of the paper feature noise (default 1.0)",
}

_INT_KEYS = frozenset({"papers", "seed", "features", "classes"})
_YEARS = np.arange(2010, 2020, dtype=np.int64)
_YEAR_GROWTH = 1.15  # each year publishes 15% more papers than the one before
_REDRAW_ROUNDS = 12  # rounds of redrawing repeated pairs
CENTROID_SCALE = 2.5  # oracle nearest-centroid accuracy ~34% at 349 venues x 128 features (mag's MLP: ~27%)


def _accepted() -> str:
    return "; ".join(f"{key}: {help_}" for key, help_ in ACCEPTED_KEYS.items())


def _bad(key: str, value: object, why: str) -> InvalidInputError:
    return InvalidInputError(f"{SCHEME} spec: {key}={value!r} is invalid ({why}); accepted keys: {_accepted()}")


@dataclass(frozen=True)
class SyntheticMagSpec:
    """Parameters of an ogbn-mag-shaped graph, validated on construction.

    Parameters
    ----------
    papers : int
        Number of papers, at least 2; the other node and edge counts keep ogbn-mag's ratios to it.
    seed : int
        Seed of everything random: edges, labels, years, masks and features.
    features : int
        Width of the paper features ``x``; 0 leaves ``x`` out. Other node types never get features.
    classes : int
        Number of venues (paper labels ``y``); ogbn-mag has 349. Keep ``papers / classes`` above ~50,
        or venues hold too few authors and fields to plant their structure (use e.g. 8 for small tests).
    train, val : float
        Split fractions of papers, taken oldest first; the newest remaining papers are test papers.
    homophily : float
        Probability that an edge stays inside the venue community of its first end.
    noise : float
        Standard deviation of the per-value paper feature noise around the venue centroid.

    Examples
    --------
    >>> spec = SyntheticMagSpec(papers=10_000)
    >>> spec.num_nodes["author"], spec.num_edges[("paper", "cites", "paper")]
    (15408, 73552)
    """

    papers: int
    seed: int = 0
    features: int = 128
    classes: int = 349
    train: float = 0.6
    val: float = 0.2
    homophily: float = 0.8
    noise: float = 1.0

    def __post_init__(self) -> None:
        coerce_fields(self, _INT_KEYS, _bad)
        self._check_ranges()

    def _check_ranges(self) -> None:
        checks = [
            ("papers", self.papers >= 2),
            ("seed", 0 <= self.seed < 2**63),
            ("features", self.features >= 0),
            ("classes", self.classes >= 2),
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
        if self.classes > self.papers:
            raise _bad("classes", self.classes, f"more classes than papers ({self.papers}); every class needs nodes: "
                       f"give classes <= papers")

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes per type: ogbn-mag's count times ``papers / 736,389``, at least 1."""
        scale = self.papers / OGBN_MAG_NODES[PAPER]
        return {ntype: max(1, round(n * scale)) if ntype != PAPER else self.papers
                for ntype, n in OGBN_MAG_NODES.items()}

    @property
    def num_edges(self) -> dict[EdgeType, int]:
        """Edges per forward type (the reverse types have as many): ogbn-mag's count, scaled, at least 1."""
        scale = self.papers / OGBN_MAG_NODES[PAPER]
        return {etype: max(1, round(n * scale)) for etype, n in OGBN_MAG_EDGES.items()}

    def to_string(self) -> str:
        """The canonical SOURCE string, every key spelled out, that parses back to this spec."""
        parts = ",".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{SCHEME}:{parts}"


def parse_synthetic_mag_spec(spec: str) -> SyntheticMagSpec:
    """Parse ``"papers=N,seed=S,..."`` (optionally prefixed by ``"synthetic-mag:"``).

    Parameters
    ----------
    spec : str
        Comma-separated ``key=value`` pairs; see :data:`ACCEPTED_KEYS`. ``papers`` is required.

    Returns
    -------
    SyntheticMagSpec
        The validated parameters, defaults filled in.

    Raises
    ------
    InvalidInputError
        On an unknown, repeated or missing key, a malformed pair or an out-of-range value.

    Examples
    --------
    >>> parse_synthetic_mag_spec("synthetic-mag:papers=1000,classes=8,seed=7").classes
    8
    """
    values = parse_pairs(spec, SCHEME, ACCEPTED_KEYS, _INT_KEYS, required="papers")
    return SyntheticMagSpec(**values)  # type: ignore[arg-type]


def _groups(seq: np.random.SeedSequence, count: int, classes: int) -> Communities:
    """``count`` nodes spread evenly over ``classes`` venue communities, with capped Pareto weights."""
    rng = np.random.default_rng(seq)
    community = rng.permutation(count).astype(np.int64) % classes
    weights = rng.pareto(PARETO_SHAPE, count) + 1.0
    np.minimum(weights, math.sqrt(count), out=weights)  # no single freak hub
    return Communities.build(community, weights, classes)


def _firsts(rng: np.random.Generator, count: int, edges: int) -> np.ndarray:
    """First ends of ``edges`` edges: every one of ``count`` nodes once (while edges last), then uniform."""
    first = rng.permutation(count)[:edges]
    if edges > count:
        first = np.concatenate([first, rng.integers(0, count, edges - count)])
    return first.astype(np.int64, copy=False)


def _partners(groups: Communities, rng: np.random.Generator, community: np.ndarray, homophily: float) -> np.ndarray:
    """A weighted node of ``groups`` per entry: from ``community`` w.p. ``homophily`` (if it has nodes), else any."""
    count, total, last = len(community), groups.cumw[-1], len(groups.order) - 1
    inside = (rng.random(count) < homophily) & (groups.mass[community] > 0)
    r = rng.random(count)
    target = np.where(inside, groups.base[community] + r * groups.mass[community], r * total)
    pos = search_sorted(groups.cumw, target)
    # float rounding at a community's upper edge must not leak into the next community
    pos = np.clip(pos, np.where(inside, groups.start[community], 0), np.where(inside, groups.end[community] - 1, last))
    return groups.order[pos]


def _link(rng: np.random.Generator, first: Communities, second: Communities, edges: int, homophily: float,
          report: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray]:
    """``edges`` edges from nodes of ``first`` (each at least once) to homophilous weighted nodes of ``second``."""
    src = _firsts(rng, len(first.community), edges)
    dst = np.empty(edges, dtype=np.int64)
    for lo in range(0, edges, EDGES_PER_STEP):
        hi = min(lo + EDGES_PER_STEP, edges)
        dst[lo:hi] = _partners(second, rng, first.community[src[lo:hi]], homophily)
        report(hi - lo)
    return src, dst


def _pair_keys(fixed: np.ndarray, free: np.ndarray, count: int, either_way: bool) -> np.ndarray:
    """One int64 per pair; ``either_way`` gives (a, b) and (b, a) the same key."""
    a, b = (np.minimum(fixed, free), np.maximum(fixed, free)) if either_way else (fixed, free)
    return a * count + b


def _later_repeats(keys: np.ndarray) -> np.ndarray:
    """True where a key equals one at an earlier position; found by position, so the unstable sort is safe."""
    repeated = np.ones(len(keys), dtype=bool)
    if len(keys):
        order = np.argsort(keys)
        ordered = keys[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        repeated[np.minimum.reduceat(order, starts)] = False
    return repeated


def _make_distinct(rng: np.random.Generator, fixed: np.ndarray, fixed_groups: Communities, free: np.ndarray,
                   free_groups: Communities, homophily: float, either_way: bool = False) -> None:
    """Draw ``free`` again, in place, where a pair repeats an earlier one (or, ``either_way``, is a self-loop).

    One sort of all pairs, then rounds over the redrawn ones only, checked against the pairs kept so far.
    Only a graph whose communities hold fewer nodes than a degree (tiny ``papers / classes``) keeps repeats.
    """
    count = len(free_groups.order)
    keys = _pair_keys(fixed, free, count, either_way)
    bad = _later_repeats(keys) | ((fixed == free) if either_way else False)
    taken, again = np.sort(keys[~bad]), np.flatnonzero(bad)
    for _ in range(_REDRAW_ROUNDS):
        if not len(again):
            return
        free[again] = _partners(free_groups, rng, fixed_groups.community[fixed[again]], homophily)
        keys = _pair_keys(fixed[again], free[again], count, either_way)
        found = np.minimum(np.searchsorted(taken, keys), max(len(taken) - 1, 0))
        bad = _later_repeats(keys) | ((taken[found] == keys) if len(taken) else False)
        if either_way:
            bad |= fixed[again] == free[again]
        fresh = np.sort(keys[~bad])
        taken, again = np.insert(taken, np.searchsorted(taken, fresh), fresh), again[bad]


def _writes(rng: np.random.Generator, authors: Communities, papers: Communities, edges: int, homophily: float,
            report: Callable[[int], None]) -> EdgeTable:
    """Every author writes a paper, then every paper gets authors; an author never writes a paper twice."""
    covered = min(len(authors.community), edges)
    a_author, a_paper = _link(rng, authors, papers, covered, homophily, report)
    p_paper, p_author = _link(rng, papers, authors, edges - covered, homophily, report)
    author, paper = np.concatenate([a_author, p_author]), np.concatenate([a_paper, p_paper])
    # the first ``covered`` pairs have distinct authors, so every repeat lies past them: redraw its author
    _make_distinct(rng, paper, papers, author, authors, homophily)
    return EdgeTable(author, paper)


def _cites(rng: np.random.Generator, papers: Communities, time: np.ndarray, edges: int, homophily: float,
           report: Callable[[int], None]) -> EdgeTable:
    """Every paper cites or is cited; no self-citations or mutual pairs; the newer paper cites the older."""
    citing, cited = _link(rng, papers, papers, edges, homophily, report)
    _make_distinct(rng, citing, papers, cited, papers, homophily, either_way=True)
    flip = time[citing] < time[cited]
    return EdgeTable(np.where(flip, cited, citing), np.where(flip, citing, cited))


def _relations(spec: SyntheticMagSpec, groups: dict[str, Communities], time: np.ndarray,
               rng: np.random.Generator, report: Callable[[int], None]) -> dict[EdgeType, EdgeTable]:
    """The four forward edge types of ogbn-mag, in PyG's order, without repeated pairs."""
    counts, h = spec.num_edges, spec.homophily
    # fewer affiliations than authors: each author has at most one, so no pair repeats
    author, inst = _link(rng, groups[AUTHOR], groups[INSTITUTION], counts[AFFILIATED_WITH], h, report)
    writes = _writes(rng, groups[AUTHOR], groups[PAPER], counts[WRITES], h, report)
    cites = _cites(rng, groups[PAPER], time, counts[CITES], h, report)
    paper, topic = _link(rng, groups[PAPER], groups[FIELD], counts[HAS_TOPIC], h, report)
    _make_distinct(rng, paper, groups[PAPER], topic, groups[FIELD], h)
    return {AFFILIATED_WITH: EdgeTable(author, inst), WRITES: writes, CITES: cites, HAS_TOPIC: EdgeTable(paper, topic)}


def _years_and_masks(rng: np.random.Generator, spec: SyntheticMagSpec) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Publication years 2010-2019 (growing output) and a temporal split: oldest train, then val, newest test."""
    n = spec.papers
    growth = _YEAR_GROWTH ** np.arange(len(_YEARS))
    time = rng.choice(_YEARS, size=n, p=growth / growth.sum())
    order = np.lexsort((rng.random(n), time))  # by year, ties in random order
    n_train = round(spec.train * n)
    n_val = min(round(spec.val * n), n - n_train)
    bounds = {"train_mask": (0, n_train), "val_mask": (n_train, n_train + n_val), "test_mask": (n_train + n_val, n)}
    masks = {name: np.zeros(n, dtype=bool) for name in bounds}
    for name, (lo, hi) in bounds.items():
        masks[name][order[lo:hi]] = True
    return time, masks


def _progress(total: int, progress: Callable[[int, int], None] | None) -> Callable[[int], None]:
    done = [0]

    def report(count: int) -> None:
        done[0] += count
        if progress is not None:
            progress(done[0], total)

    return report


def synthetic_mag_graph(spec: SyntheticMagSpec, *, progress: Callable[[int, int], None] | None = None) -> GraphSource:
    """Generate the ogbn-mag-shaped heterogeneous graph ``spec`` describes, deterministically from ``spec.seed``.

    Every node of every type joins one of ``classes`` venue communities (evenly) and gets a capped Pareto
    weight; a paper's label ``y`` is its community. Each edge starts at a node of its first type (every
    node at least once, then uniformly) and ends at a weight-sampled node of the other type, inside the
    first end's community with probability ``homophily``: co-authors, citations and topics cluster by
    venue. Every author writes at least one paper and every paper has an author, a topic and a citation.
    No pair is linked twice, no paper cites itself and no two papers cite each other (repeats are drawn
    again; only a tiny graph with venues too small for its degrees keeps a few). Citations run from the
    newer paper to the older one.

    Papers carry ``x`` (a lazy :class:`~graphstore.ingest.synthetic.SyntheticFeatures`: venue centroid
    plus noise), ``y``, ``time`` (int64 year, 2010-2019) and ``train_mask``/``val_mask``/``test_mask``
    split by year (oldest papers train, newest test). Authors, institutions and fields of study have no
    attributes, as in PyG's ``OGB_MAG``: models give them learned embeddings or zero features. The
    reverse types ``rev_writes``, ``rev_affiliated_with`` and ``rev_has_topic`` hold the same arrays as
    their forward types, swapped; ``cites`` stays directed (``to_undirected`` at ingest symmetrizes it).

    Parameters
    ----------
    spec : SyntheticMagSpec
        The parameters, e.g. from :func:`parse_synthetic_mag_spec`.
    progress : callable, optional
        Called as ``progress(done, total)`` in forward edges while edges are drawn.

    Returns
    -------
    GraphSource
        Named ``"synthetic-mag"``, with ``origin`` the canonical spec string.

    Examples
    --------
    >>> g = synthetic_mag_graph(parse_synthetic_mag_spec("papers=2000,classes=8,features=16"))
    >>> g.nodes["paper"].attrs["x"].shape, g.edges[("paper", "cites", "paper")].num_edges
    ((2000, 16), 14710)
    """
    seqs = dict(zip([*OGBN_MAG_NODES, "edges", "time", "centroids", "key"], np.random.SeedSequence(spec.seed).spawn(8)))
    groups = {ntype: _groups(seqs[ntype], n, spec.classes) for ntype, n in spec.num_nodes.items()}
    time, masks = _years_and_masks(np.random.default_rng(seqs["time"]), spec)
    report = _progress(sum(spec.num_edges.values()), progress)
    edges = _relations(spec, groups, time, np.random.default_rng(seqs["edges"]), report)
    edges.update({rev: EdgeTable(edges[fwd].dst, edges[fwd].src) for fwd, rev in REVERSE.items()})
    labels = groups[PAPER].community
    paper = {"y": ArrayRows(labels), "time": ArrayRows(time), **{k: ArrayRows(v) for k, v in masks.items()}}
    if spec.features > 0:
        scale = CENTROID_SCALE / math.sqrt(spec.features)
        centroids = np.random.default_rng(seqs["centroids"]).normal(0.0, scale, (spec.classes, spec.features))
        key = int(seqs["key"].generate_state(1, dtype=np.uint64)[0])
        paper = {"x": SyntheticFeatures(labels, centroids, key, spec.noise), **paper}
    nodes = {ntype: NodeTable(n, paper if ntype == PAPER else {}) for ntype, n in spec.num_nodes.items()}
    logger.info("synthetic-mag graph: %s nodes, %s edges", spec.num_nodes,
                {etype[1]: table.num_edges for etype, table in edges.items()})
    return GraphSource(nodes=nodes, edges=edges, name="synthetic-mag", origin=spec.to_string())
