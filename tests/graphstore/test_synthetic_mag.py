"""Tests of the ogbn-mag-shaped synthetic generator: spec parsing, structure, determinism, homophily, ingest."""

from __future__ import annotations

import numpy as np
import pytest

import graphstore
from graphstore.errors import InvalidInputError
from graphstore.ingest.source import GraphSource, RowSource
from graphstore.ingest.sources import resolve_source
from graphstore.ingest.synthetic import SyntheticFeatures
from graphstore.ingest.synthetic_mag import (
    AFFILIATED_WITH,
    CITES,
    HAS_TOPIC,
    REVERSE,
    WRITES,
    SyntheticMagSpec,
    parse_synthetic_mag_spec,
    synthetic_mag_graph,
)
from tests.conftest import Expected, assert_roundtrip

SMALL = "papers=3000,classes=8,features=16,seed=3"
NODE_TYPES = ["paper", "author", "institution", "field_of_study"]
PAPER_ATTRS = {"x", "y", "time", "train_mask", "val_mask", "test_mask"}


def _build(spec: str) -> GraphSource:
    return synthetic_mag_graph(parse_synthetic_mag_spec(spec))


def _all(source: RowSource) -> np.ndarray:
    return source.take(np.arange(source.shape[0]))


@pytest.fixture(scope="module")
def graph() -> GraphSource:
    return _build(SMALL)


# --- spec parsing -----------------------------------------------------------------------------


def test_defaults_and_prefix() -> None:
    spec = parse_synthetic_mag_spec(" synthetic-mag:papers=1e4, seed=2,")
    assert spec == SyntheticMagSpec(papers=10_000, seed=2, features=128, classes=349, train=0.6, val=0.2,
                                    homophily=0.8, noise=1.0)
    assert parse_synthetic_mag_spec(spec.to_string()) == spec
    assert spec.to_string().startswith("synthetic-mag:papers=10000,seed=2,")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "'papers'"),
        ("seed=1", "'papers'"),
        ("papers=1", "papers=1"),
        ("papers=abc", "papers='abc'"),
        ("papers=2.5", "papers='2.5'"),
        ("papers=10,classes=1", "classes=1"),
        ("papers=10,features=-1", "features=-1"),
        ("papers=10,seed=-1", "seed=-1"),
        ("papers=10,train=0.7,val=0.5", "train + val"),
        ("papers=10,homophily=1.2", "homophily=1.2"),
        ("papers=10,noise=nan", "noise=nan"),
        ("papers=10,nodes=5", "unknown key 'nodes'"),
        ("papers=10,avg_degree=5", "unknown key 'avg_degree'"),
        ("papers=10,classes", "'classes' is not key=value"),
        ("papers=10,papers=20", "'papers' given twice"),
    ],
)
def test_bad_spec_names_the_problem(text: str, named: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_synthetic_mag_spec(text)
    message = str(info.value)
    assert named in message and isinstance(info.value, ValueError)
    if "twice" not in named:
        assert "accepted keys" in message and "papers" in message and "homophily" in message


def test_bad_spec_through_resolve_source() -> None:
    with pytest.raises(InvalidInputError, match="unknown key 'density'.*accepted keys"):
        resolve_source("synthetic-mag:papers=100,density=3")


@pytest.mark.parametrize("kwargs", [{"papers": True}, {"papers": 10.0}, {"papers": 10, "val": "0.1"}])
def test_spec_rejects_wrong_types(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        SyntheticMagSpec(**kwargs)  # type: ignore[arg-type]


# --- structure --------------------------------------------------------------------------------


def test_types_and_attributes(graph: GraphSource) -> None:
    assert graph.is_hetero and graph.name == "synthetic-mag"
    assert graph.origin == parse_synthetic_mag_spec(SMALL).to_string()
    assert list(graph.nodes) == NODE_TYPES
    assert set(graph.edges) == {WRITES, CITES, AFFILIATED_WITH, HAS_TOPIC, *REVERSE.values()}
    assert set(graph.nodes["paper"].attrs) == PAPER_ATTRS
    for ntype in NODE_TYPES[1:]:
        assert graph.nodes[ntype].attrs == {}  # labels and features on papers only
    x = graph.nodes["paper"].attrs["x"]
    assert isinstance(x, SyntheticFeatures) and x.shape == (3000, 16) and x.dtype == np.float32
    y = _all(graph.nodes["paper"].attrs["y"])
    assert y.dtype == np.int64 and np.array_equal(np.bincount(y), np.full(8, 375))
    assert "x" not in _build("papers=50,classes=4,features=0").nodes["paper"].attrs


@pytest.mark.parametrize("papers", [3000, 12000])
def test_counts_scale_like_ogbn_mag(papers: int) -> None:
    spec = parse_synthetic_mag_spec(f"papers={papers},classes=8,features=0")
    g = synthetic_mag_graph(spec)
    ratios = {"author": 1.5408, "institution": 0.01187, "field_of_study": 0.08143}
    for ntype, ratio in ratios.items():
        assert g.nodes[ntype].num_nodes == spec.num_nodes[ntype] == pytest.approx(ratio * papers, abs=1)
    per_paper = {WRITES: 9.7036, CITES: 7.3552, AFFILIATED_WITH: 1.4177, HAS_TOPIC: 10.1917}
    for etype, ratio in per_paper.items():
        assert g.edges[etype].num_edges == spec.num_edges[etype] == pytest.approx(ratio * papers, abs=1)
        assert g.edges[REVERSE.get(etype, etype)].num_edges == g.edges[etype].num_edges


def test_ids_in_range_per_type(graph: GraphSource) -> None:
    for (s_type, _, d_type), table in graph.edges.items():
        assert table.src.dtype == np.int64 and table.dst.dtype == np.int64
        assert table.src.min() >= 0 and table.src.max() < graph.nodes[s_type].num_nodes
        assert table.dst.min() >= 0 and table.dst.max() < graph.nodes[d_type].num_nodes


def test_every_author_and_paper_is_connected(graph: GraphSource) -> None:
    writes = graph.edges[WRITES]
    assert np.bincount(writes.src, minlength=graph.nodes["author"].num_nodes).min() >= 1
    assert np.bincount(writes.dst, minlength=3000).min() >= 1
    assert np.bincount(graph.edges[HAS_TOPIC].src, minlength=3000).min() >= 1


def _repeats(src: np.ndarray, dst: np.ndarray) -> int:
    return len(src) - len(np.unique(src * (dst.max() + 1) + dst))


def test_pairs_are_not_repeated(graph: GraphSource) -> None:
    for etype in (WRITES, AFFILIATED_WITH):
        assert _repeats(graph.edges[etype].src, graph.edges[etype].dst) == 0
    cites = graph.edges[CITES]
    assert not (cites.src == cites.dst).any()
    lo, hi = np.minimum(cites.src, cites.dst), np.maximum(cites.src, cites.dst)
    assert _repeats(lo, hi) == 0  # not even a mutual pair
    # 36 fields in 8 venues cannot give each paper ~10 distinct in-venue topics: a rare repeat stays
    assert _repeats(graph.edges[HAS_TOPIC].src, graph.edges[HAS_TOPIC].dst) < 0.001 * graph.edges[HAS_TOPIC].num_edges


def test_reverse_edges_are_exact_reverses(graph: GraphSource) -> None:
    for forward, reverse in REVERSE.items():
        assert reverse == (forward[2], f"rev_{forward[1]}", forward[0])
        np.testing.assert_array_equal(graph.edges[reverse].src, graph.edges[forward].dst)
        np.testing.assert_array_equal(graph.edges[reverse].dst, graph.edges[forward].src)


def test_years_and_temporal_split(graph: GraphSource) -> None:
    attrs = graph.nodes["paper"].attrs
    time = _all(attrs["time"])
    assert time.dtype == np.int64 and time.min() == 2010 and time.max() == 2019
    masks = [_all(attrs[name]) for name in ("train_mask", "val_mask", "test_mask")]
    np.testing.assert_array_equal(np.sum(masks, axis=0), np.ones(3000))  # disjoint and covering
    assert [m.sum() for m in masks] == [1800, 600, 600]
    assert time[masks[0]].max() <= time[masks[1]].min() <= time[masks[1]].max() <= time[masks[2]].min()
    cites = graph.edges[CITES]
    assert (time[cites.src] >= time[cites.dst]).all()  # a paper cites older (or same-year) papers


# --- homophily and features -------------------------------------------------------------------


def _same_label_cites(g: GraphSource) -> float:
    y, cites = _all(g.nodes["paper"].attrs["y"]), g.edges[CITES]
    return float((y[cites.src] == y[cites.dst]).mean())


def test_homophily(graph: GraphSource) -> None:
    assert _same_label_cites(graph) > 0.75  # expected 0.8 + 0.2 / 8, chance 1 / 8
    assert _same_label_cites(_build(SMALL + ",homophily=0")) < 0.2
    # papers sharing an author mostly share a venue too
    y, writes = _all(graph.nodes["paper"].attrs["y"]), graph.edges[WRITES]
    order = np.argsort(writes.src, kind="stable")
    authors, papers = writes.src[order], writes.dst[order]
    same_author = authors[1:] == authors[:-1]
    assert (y[papers[1:]] == y[papers[:-1]])[same_author].mean() > 0.5


def test_features_are_informative_not_trivial(graph: GraphSource) -> None:
    attrs = graph.nodes["paper"].attrs
    x, y, train, test = (_all(attrs[k]) for k in ("x", "y", "train_mask", "test_mask"))
    centroids = np.stack([x[train & (y == c)].mean(axis=0) for c in range(8)])
    guess = np.argmin(((x[test][:, None, :] - centroids[None]) ** 2).sum(axis=-1), axis=1)
    assert 0.3 < float((guess == y[test]).mean()) < 0.97  # chance is 0.125


# --- determinism ------------------------------------------------------------------------------


def _arrays(g: GraphSource) -> list[np.ndarray]:
    out = [_all(rows) for table in g.nodes.values() for rows in table.attrs.values()]
    return out + [a for table in g.edges.values() for a in (table.src, table.dst)]


def test_same_seed_same_graph(graph: GraphSource) -> None:
    for a, b in zip(_arrays(graph), _arrays(_build(SMALL)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_other_seed_other_graph(graph: GraphSource) -> None:
    other = _build(SMALL.replace("seed=3", "seed=4"))
    assert not np.array_equal(graph.edges[CITES].src, other.edges[CITES].src)
    assert not np.array_equal(graph.edges[WRITES].dst, other.edges[WRITES].dst)
    assert not np.array_equal(_all(graph.nodes["paper"].attrs["x"]), _all(other.nodes["paper"].attrs["x"]))


def test_progress_reports_all_forward_edges() -> None:
    calls: list[tuple[int, int]] = []
    spec = parse_synthetic_mag_spec("papers=500,classes=4,features=0")
    synthetic_mag_graph(spec, progress=lambda done, total: calls.append((done, total)))
    total = sum(spec.num_edges.values())
    assert calls[-1] == (total, total) and all(a <= b for (a, _), (b, _) in zip(calls, calls[1:]))


# --- ingest round trip ------------------------------------------------------------------------


def test_ingest_roundtrip(tmp_path, graph: GraphSource) -> None:
    expected = Expected(
        num_nodes={ntype: table.num_nodes for ntype, table in graph.nodes.items()},
        node_attrs={"paper": {name: _all(rows) for name, rows in graph.nodes["paper"].attrs.items()}},
        edges={etype: (table.src.copy(), table.dst.copy()) for etype, table in graph.edges.items()},
    )
    summary = graphstore.ingest(f"synthetic-mag:{SMALL}", tmp_path / "mag", num_parts=2)
    assert summary.num_parts == 2
    ds = graphstore.open_dataset(tmp_path / "mag")
    assert ds.is_hetero and set(ds.node_types) == set(NODE_TYPES) and set(ds.edge_types) == set(graph.edges)
    assert_roundtrip(ds, expected)
