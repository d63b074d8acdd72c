"""Tests of the synthetic graph generator: spec parsing, structure, determinism and lazy features."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from graphstore.errors import InvalidInputError
from graphstore.ingest import synthetic, synthetic_chunks
from graphstore.ingest.source import GraphSource, RowSource
from graphstore.ingest.synthetic import SyntheticFeatures, SyntheticSpec, parse_synthetic_spec
from graphstore.ingest.synthetic_chunks import synthetic_graph

SMALL = "nodes=5000,avg_degree=8,features=16,classes=4,seed=3"


def _build(spec: str) -> GraphSource:
    return synthetic_graph(parse_synthetic_spec(spec))


def _all(source: RowSource) -> np.ndarray:
    return source.take(np.arange(source.shape[0]))


@pytest.fixture(scope="module")
def graph() -> GraphSource:
    return _build(SMALL)


# --- spec parsing -----------------------------------------------------------------------------


def test_defaults() -> None:
    spec = parse_synthetic_spec("nodes=100")
    assert spec == SyntheticSpec(nodes=100, avg_degree=10.0, features=64, classes=8, seed=0,
                                 train=0.6, val=0.2, homophily=0.8, noise=1.0)
    assert isinstance(spec.avg_degree, float) and isinstance(spec.nodes, int)


def test_every_key_prefix_and_whitespace() -> None:
    spec = parse_synthetic_spec(
        " synthetic:nodes=2.4e3, avg_degree=5.5,features=0,classes=3,seed=9,train=0.5,val=0.25,"
        "homophily=0.3,noise=2 ,"
    )
    assert spec == SyntheticSpec(2400, 5.5, 0, 3, 9, 0.5, 0.25, 0.3, 2.0)


def test_canonical_string_round_trips() -> None:
    spec = parse_synthetic_spec("nodes=123,avg_degree=3.3,seed=5,noise=0.1")
    text = spec.to_string()
    assert text.startswith("synthetic:nodes=123,")
    assert parse_synthetic_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "'nodes'"),
        ("seed=1", "'nodes'"),
        ("nodes=1", "nodes=1"),
        ("nodes=abc", "nodes='abc'"),
        ("nodes=2.5", "nodes='2.5'"),
        ("nodes=10,avg_degree=0", "avg_degree=0.0"),
        ("nodes=10,avg_degree=-3", "avg_degree=-3.0"),
        ("nodes=10,avg_degree=nan", "avg_degree=nan"),
        ("nodes=10,avg_degree=many", "avg_degree='many'"),
        ("nodes=10,features=-1", "features=-1"),
        ("nodes=10,classes=1", "classes=1"),
        ("nodes=10,seed=-1", "seed=-1"),
        ("nodes=10,train=1.5", "train=1.5"),
        ("nodes=10,val=-0.1", "val=-0.1"),
        ("nodes=10,train=0.7,val=0.5", "train + val"),
        ("nodes=10,homophily=1.2", "homophily=1.2"),
        ("nodes=10,noise=-1", "noise=-1.0"),
        ("nodes=10,noise=inf", "noise=inf"),
        ("nodez=10", "unknown key 'nodez'"),
        ("nodes=10,density=3", "unknown key 'density'"),
        ("nodes=10,classes", "'classes' is not key=value"),
        ("nodes=10,=3", "'=3' is not key=value"),
        ("nodes=10,nodes=20", "'nodes' given twice"),
    ],
)
def test_bad_spec_names_the_problem(text: str, named: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_synthetic_spec(text)
    message = str(info.value)
    assert named in message
    assert isinstance(info.value, ValueError)
    if "twice" not in named:
        assert "accepted keys" in message and "avg_degree" in message and "homophily" in message


@pytest.mark.parametrize(
    "kwargs",
    [{"nodes": True}, {"nodes": 10.0}, {"nodes": "10"}, {"nodes": 10, "noise": "1"}, {"nodes": 10, "val": None}],
)
def test_spec_rejects_wrong_types(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        SyntheticSpec(**kwargs)  # type: ignore[arg-type]


# --- structure --------------------------------------------------------------------------------


def test_graph_shape(graph: GraphSource) -> None:
    spec = parse_synthetic_spec(SMALL)
    assert graph.name == "synthetic" and graph.origin == spec.to_string()
    assert not graph.is_hetero and list(graph.edges) == [None]
    table = graph.nodes[None]
    assert table.num_nodes == 5000
    assert set(table.attrs) == {"x", "y", "train_mask", "val_mask", "test_mask"}
    x = table.attrs["x"]
    assert isinstance(x, RowSource) and isinstance(x, SyntheticFeatures)
    assert x.shape == (5000, 16) and x.dtype == np.float32
    y = _all(table.attrs["y"])
    assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1, 2, 3}


@pytest.mark.parametrize(("nodes", "avg_degree"), [(5000, 8.0), (999, 7.3), (2, 0.4), (3, 1.0)])
def test_edge_count_ids_and_dtype(nodes: int, avg_degree: float) -> None:
    edges = _build(f"nodes={nodes},avg_degree={avg_degree},features=0,classes=2").edges[None]
    assert edges.num_edges % 2 == 0
    assert abs(edges.num_edges - nodes * avg_degree) <= 1
    assert edges.src.dtype == np.int64 and edges.dst.dtype == np.int64
    if edges.num_edges:
        assert edges.src.min() >= 0 and edges.dst.min() >= 0
        assert edges.src.max() < nodes and edges.dst.max() < nodes


def test_edges_are_symmetric(graph: GraphSource) -> None:
    edges, n = graph.edges[None], graph.nodes[None].num_nodes
    forward = np.sort(edges.src * n + edges.dst)
    backward = np.sort(edges.dst * n + edges.src)
    np.testing.assert_array_equal(forward, backward)


def test_degrees_are_heavy_tailed(graph: GraphSource) -> None:
    degree = np.bincount(graph.edges[None].dst, minlength=5000)
    assert degree.mean() == pytest.approx(8.0)
    assert degree.max() >= 10 * degree.mean()
    top = np.sort(degree)[::-1][: len(degree) // 100]
    assert top.sum() >= 0.05 * degree.sum()  # a Poisson graph would give the top 1% about 2.5%


def test_homophily(graph: GraphSource) -> None:
    def same_label(g: GraphSource) -> float:
        y, edges = _all(g.nodes[None].attrs["y"]), g.edges[None]
        return float((y[edges.src] == y[edges.dst]).mean())

    assert same_label(graph) > 0.7  # expected 0.8 + 0.2 / 4
    assert same_label(_build("nodes=5000,avg_degree=8,features=0,classes=4,seed=3,homophily=0")) < 0.35


# --- determinism ------------------------------------------------------------------------------


def test_same_seed_same_graph(graph: GraphSource) -> None:
    again = _build(SMALL)
    np.testing.assert_array_equal(graph.edges[None].src, again.edges[None].src)
    np.testing.assert_array_equal(graph.edges[None].dst, again.edges[None].dst)
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(_all(graph.nodes[None].attrs[name]), _all(again.nodes[None].attrs[name]))


def test_other_seed_other_graph(graph: GraphSource) -> None:
    other = _build(SMALL.replace("seed=3", "seed=4"))
    assert not np.array_equal(graph.edges[None].src, other.edges[None].src)
    assert not np.array_equal(_all(graph.nodes[None].attrs["x"]), _all(other.nodes[None].attrs["x"]))
    assert not np.array_equal(_all(graph.nodes[None].attrs["train_mask"]), _all(other.nodes[None].attrs["train_mask"]))


# --- lazy features ----------------------------------------------------------------------------


def test_take_matches_full_rows(graph: GraphSource, monkeypatch: pytest.MonkeyPatch) -> None:
    x = graph.nodes[None].attrs["x"]
    full = _all(x)
    rows = np.array([4999, 5, 5, 0, 1234, 5, 17], dtype=np.int64)
    np.testing.assert_array_equal(x.take(rows), full[rows])
    np.testing.assert_array_equal(x.take(np.array([5])), full[5:6])
    np.testing.assert_array_equal(x.take([3, 2]), full[[3, 2]])  # type: ignore[arg-type]
    np.testing.assert_array_equal(x.take(np.array([7], dtype=np.int32)), full[7:8])
    assert x.take(np.array([], dtype=np.int64)).shape == (0, 16)
    monkeypatch.setattr(synthetic, "_TAKE_BLOCK", 50)  # 3 rows per block: exercise the batching
    shuffled = np.random.default_rng(0).permutation(5000)[:301]
    np.testing.assert_array_equal(x.take(shuffled), full[shuffled])


def test_features_pickle(graph: GraphSource) -> None:
    x = graph.nodes[None].attrs["x"]
    rows = np.array([9, 1, 4000])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(x)).take(rows), x.take(rows))


@pytest.mark.parametrize("rows", [np.array([-1]), np.array([5000]), np.array([0.5]), np.zeros((2, 2), dtype=np.int64)])
def test_take_rejects_bad_rows(graph: GraphSource, rows: np.ndarray) -> None:
    with pytest.raises(InvalidInputError):
        graph.nodes[None].attrs["x"].take(rows)


def test_features_are_informative_not_trivial(graph: GraphSource) -> None:
    attrs = graph.nodes[None].attrs
    x, y = _all(attrs["x"]), _all(attrs["y"])
    train, test = _all(attrs["train_mask"]), _all(attrs["test_mask"])
    centroids = np.stack([x[train & (y == c)].mean(axis=0) for c in range(4)])
    guess = np.argmin(((x[test][:, None, :] - centroids[None]) ** 2).sum(axis=-1), axis=1)
    accuracy = float((guess == y[test]).mean())
    assert 0.5 < accuracy < 0.95  # chance is 0.25


def test_noise_scale(graph: GraphSource) -> None:
    x, y = _all(graph.nodes[None].attrs["x"]), _all(graph.nodes[None].attrs["y"])
    residual = np.concatenate([x[y == c] - x[y == c].mean(axis=0) for c in range(4)])
    assert residual.std() == pytest.approx(1.0, rel=0.05)
    quiet = _build(SMALL + ",noise=0").nodes[None].attrs
    xq, yq = _all(quiet["x"]), _all(quiet["y"])
    for c in range(4):
        np.testing.assert_array_equal(xq[yq == c], np.broadcast_to(xq[yq == c][0], xq[yq == c].shape))


def test_no_features() -> None:
    assert "x" not in _build("nodes=50,features=0").nodes[None].attrs


# --- masks and progress -----------------------------------------------------------------------


@pytest.mark.parametrize(("train", "val"), [(0.6, 0.2), (0.5, 0.5), (0.0, 0.3), (0.333, 0.333)])
def test_masks_disjoint_with_right_sizes(train: float, val: float) -> None:
    attrs = _build(f"nodes=1001,avg_degree=2,features=0,train={train},val={val}").nodes[None].attrs
    masks = [_all(attrs[name]) for name in ("train_mask", "val_mask", "test_mask")]
    assert all(m.dtype == np.bool_ and m.shape == (1001,) for m in masks)
    np.testing.assert_array_equal(np.sum(masks, axis=0), np.ones(1001))  # disjoint and covering
    assert masks[0].sum() == round(train * 1001)
    assert masks[1].sum() == round(val * 1001)


def test_progress_reports_all_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synthetic_chunks, "EDGE_CHUNK", 1000)
    calls: list[tuple[int, int]] = []
    spec = parse_synthetic_spec("nodes=1000,avg_degree=5,features=0")
    edges = synthetic_graph(spec, progress=lambda done, total: calls.append((done, total)))
    assert len(calls) == 3 and calls[-1] == (5000, 5000) == (edges.edges[None].num_edges,) * 2


# --- chunks -----------------------------------------------------------------------------------


@pytest.fixture
def fresh_groups():
    """Drop the per-process cache of community tables before and after a test that resizes the blocks."""
    synthetic_chunks._groups.cache_clear()
    yield
    synthetic_chunks._groups.cache_clear()


def _chunked_arrays(spec: str, order: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Every edge and node row of the chunked source, its chunks read in ``order`` (default: reversed)."""
    from graphstore.ingest.synthetic_chunks import synthetic_chunked

    chunked = synthetic_chunked(parse_synthetic_spec(spec))
    n, m = chunked.num_nodes[None], chunked.num_edges[None]
    src, dst = np.full(m, -1), np.full(m, -1)
    chunks = chunked.edge_chunks
    for i in order if order is not None else range(len(chunks) - 1, -1, -1):
        block = pickle.loads(pickle.dumps(chunks[i])).read()
        src[block.start:block.start + len(block.src)], dst[block.start:block.start + len(block.dst)] = block.src, block.dst
    nodes: dict[str, np.ndarray] = {}
    for chunk in reversed(chunked.node_chunks):
        for name, rows in chunk.read().items():
            nodes.setdefault(name, np.zeros((n, *rows.shape[1:]), rows.dtype))[chunk.start:chunk.stop] = rows
    return src, dst, nodes


def test_chunks_in_any_order_give_the_same_graph(monkeypatch: pytest.MonkeyPatch, fresh_groups: None) -> None:
    monkeypatch.setattr(synthetic_chunks, "EDGE_CHUNK", 3000)  # 7 edge chunks
    monkeypatch.setattr(synthetic_chunks, "NODE_CHUNK", 1700)  # node chunks not aligned to the random blocks
    monkeypatch.setattr(synthetic_chunks, "NODE_BLOCK", 1000)
    spec = "nodes=5000,avg_degree=8,features=16,classes=4,seed=3"
    whole = _build(spec)
    src, dst, nodes = _chunked_arrays(spec)
    src2, dst2, _ = _chunked_arrays(spec, order=list(np.random.default_rng(1).permutation(7)))
    np.testing.assert_array_equal(src, whole.edges[None].src)
    np.testing.assert_array_equal(dst, whole.edges[None].dst)
    np.testing.assert_array_equal(src2, src)
    np.testing.assert_array_equal(dst2, dst)
    assert set(nodes) == {"x", "y", "train_mask", "val_mask", "test_mask"}
    for name, values in nodes.items():
        np.testing.assert_array_equal(values, _all(whole.nodes[None].attrs[name]))


def test_chunk_boundaries_of_node_chunks_do_not_change_values(monkeypatch: pytest.MonkeyPatch,
                                                              fresh_groups: None) -> None:
    spec = "nodes=3000,avg_degree=4,features=8,classes=3,seed=5"
    monkeypatch.setattr(synthetic_chunks, "NODE_BLOCK", 512)
    _, _, one = _chunked_arrays(spec)
    monkeypatch.setattr(synthetic_chunks, "NODE_CHUNK", 700)
    _, _, many = _chunked_arrays(spec)
    for name in one:
        np.testing.assert_array_equal(one[name], many[name])


def test_split_positions_are_a_permutation() -> None:
    for nodes in (2, 3, 17, 1000, 4097):
        spec = SyntheticSpec(nodes=nodes, classes=2)
        pos = synthetic_chunks.split_positions(spec, np.arange(nodes))
        np.testing.assert_array_equal(np.sort(pos), np.arange(nodes))
    other = synthetic_chunks.split_positions(SyntheticSpec(nodes=1000, classes=2, seed=1), np.arange(1000))
    assert not np.array_equal(other, synthetic_chunks.split_positions(SyntheticSpec(nodes=1000, classes=2),
                                                                      np.arange(1000)))


def test_resolve_chunked_and_materialize_match_resolve_source() -> None:
    from graphstore.ingest.materialize import materialize
    from graphstore.ingest.sources import resolve_chunked, resolve_source

    spec = "synthetic:nodes=800,avg_degree=5,features=4,classes=3,seed=2"
    got, want = materialize(resolve_chunked(spec)), resolve_source(spec)
    np.testing.assert_array_equal(got.edges[None].src, want.edges[None].src)
    for name, rows in want.nodes[None].attrs.items():
        np.testing.assert_array_equal(_all(got.nodes[None].attrs[name]), _all(rows))


def _read_chunk(payload: bytes, queue) -> None:  # runs in a spawned process
    block = pickle.loads(payload).read()
    queue.put(pickle.dumps((block.src, block.dst)))


def test_edge_chunk_read_in_a_spawned_process() -> None:
    import multiprocessing

    from graphstore.ingest.synthetic_chunks import synthetic_chunked

    chunk = synthetic_chunked(parse_synthetic_spec("nodes=2000,avg_degree=6,features=0,seed=9")).edge_chunks[0]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_chunk, args=(pickle.dumps(chunk), queue))
    proc.start()
    src, dst = pickle.loads(queue.get(timeout=120))
    proc.join(60)
    here = chunk.read()
    assert proc.exitcode == 0 and len(src) == 12000
    np.testing.assert_array_equal(src, here.src)
    np.testing.assert_array_equal(dst, here.dst)
