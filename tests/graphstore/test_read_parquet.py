"""The parquet: SOURCE: layout, ID remapping, bad columns, chunks read in another process, S3."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import graphstore
from graphstore.cli.app import main
from graphstore.errors import InvalidInputError, SourceNotFoundError
from graphstore.ingest.materialize import materialize
from graphstore.ingest.read_parquet import read_parquet
from graphstore.ingest.sources import resolve_chunked, resolve_source
from tests.conftest import Expected, assert_roundtrip

N, E, F = 300, 2000, 5


def _graph(seed: int = 0) -> dict[str, np.ndarray]:
    """A graph in the user's IDs: unsorted, negative, with gaps."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(-10**6, 10**6), N, replace=False)  # unsorted, negative, sparse
    pick = rng.integers(0, N, (2, E))
    return {"id": ids, "x": rng.normal(size=(N, F)).astype(np.float32), "y": rng.integers(0, 4, N),
            "train_mask": rng.random(N) < 0.5, "src": ids[pick[0]], "dst": ids[pick[1]],
            "weight": rng.random(E).astype(np.float32)}


def _write(root, g: dict[str, np.ndarray], node_files: int = 2, edge_files: int = 3, rows: int = 97) -> str:
    """Write ``g`` as PATH/nodes/*.parquet (x a list column, y as 'label') and PATH/edges/*.parquet."""
    os.makedirs(root / "nodes"), os.makedirs(root / "edges")
    nodes = pa.table({"id": g["id"], "x": pa.array(list(g["x"]), type=pa.list_(pa.float32())),
                      "label": g["y"], "train_mask": g["train_mask"]})
    edges = pa.table({"src": g["src"], "dst": g["dst"], "weight": g["weight"]})
    for kind, table, files in (("nodes", nodes, node_files), ("edges", edges, edge_files)):
        for i, part in enumerate(np.array_split(np.arange(table.num_rows), files)):
            pq.write_table(table.take(part), root / kind / f"part{i}.parquet", row_group_size=rows)
    return str(root)


def _expected(g: dict[str, np.ndarray]) -> Expected:
    """The graph in input IDs 0..N-1: the rank of each user's ID."""
    order = np.argsort(g["id"])
    rank = lambda v: np.searchsorted(g["id"][order], v)  # noqa: E731
    attrs = {"id": g["id"][order], "x": g["x"][order], "y": g["y"][order], "train_mask": g["train_mask"][order]}
    return Expected({None: N}, {None: attrs}, {None: (rank(g["src"]), rank(g["dst"]))},
                    {None: {"weight": g["weight"]}})


def test_cli_roundtrip_by_original_id(tmp_path) -> None:
    g = _graph()
    src = _write(tmp_path / "in", g)
    assert main(["ingest", f"parquet:{src}", str(tmp_path / "ds"), "--parts", "3", "--method", "random"]) == 0
    ds = graphstore.open_dataset(tmp_path / "ds")
    assert_roundtrip(ds, _expected(g))
    # the user's ID of every stored node comes back: id, and x looked up by it
    fs = ds.partition(1)[0]
    user_ids = fs[None, "id", None].numpy()
    rows = {v: i for i, v in enumerate(g["id"])}
    np.testing.assert_array_equal(fs[None, "x", None].numpy(), g["x"][[rows[v] for v in user_ids]])


def test_chunks_follow_row_groups_and_ids_are_sorted(tmp_path) -> None:
    g = _graph(1)
    chunked = read_parquet(_write(tmp_path / "in", g, rows=97))
    sizes = [c.stop - c.start for c in chunked.edge_chunks]
    per_file = [len(p) for p in np.array_split(np.arange(E), 3)]
    assert sizes == [n for f in per_file for n in [97] * (f // 97) + ([f % 97] if f % 97 else [])]
    assert [c.start for c in chunked.edge_chunks] == np.cumsum([0, *sizes[:-1]]).tolist()
    assert chunked.num_nodes == {None: N} and chunked.num_edges == {None: E}
    assert chunked.node_schema[None]["x"].shape == (F,) and set(chunked.edge_schema[None]) == {"weight"}
    ids = materialize(chunked).nodes[None].attrs["id"].take(np.arange(N))
    np.testing.assert_array_equal(ids, np.sort(g["id"]))


def test_no_nodes_dataset_uses_endpoint_union(tmp_path) -> None:
    os.makedirs(tmp_path / "edges")
    pq.write_table(pa.table({"src": [5, -2, 40], "dst": [-2, 99, 5]}), tmp_path / "edges" / "e.parquet")
    g = resolve_source(f"parquet:{tmp_path}")
    np.testing.assert_array_equal(g.nodes[None].attrs["id"].take(np.arange(4)), [-2, 5, 40, 99])
    np.testing.assert_array_equal(g.edges[None].src, [1, 0, 2])
    np.testing.assert_array_equal(g.edges[None].dst, [0, 3, 1])


def _read_in_child(payload: bytes, queue) -> None:
    chunk = pickle.loads(payload)
    block = chunk.read()
    queue.put(pickle.dumps(block if not isinstance(block, dict) else dict(block)))


def test_chunks_read_in_a_spawned_process(tmp_path) -> None:
    chunked = read_parquet(_write(tmp_path / "in", _graph(2)))
    ctx = multiprocessing.get_context("spawn")
    for chunk in (chunked.edge_chunks[4], chunked.node_chunks[0]):
        queue = ctx.Queue()
        proc = ctx.Process(target=_read_in_child, args=(pickle.dumps(chunk), queue))
        proc.start()
        got = pickle.loads(queue.get(timeout=120))
        proc.join(60)
        assert proc.exitcode == 0
        here = chunk.read()
        if isinstance(here, dict):
            assert set(got) == set(here) and all(np.array_equal(got[k], here[k]) for k in here)
        else:
            np.testing.assert_array_equal(got.src, here.src)
            np.testing.assert_array_equal(got.dst, here.dst)
            np.testing.assert_array_equal(got.attrs["weight"], here.attrs["weight"])


def _bad(tmp_path, edges: dict | None = None, nodes: dict | None = None, **kw) -> str:
    os.makedirs(tmp_path / "edges")
    pq.write_table(pa.table(edges or {"src": [1, 2], "dst": [2, 1]}), tmp_path / "edges" / "e.parquet", **kw)
    if nodes is not None:
        os.makedirs(tmp_path / "nodes")
        pq.write_table(pa.table(nodes), tmp_path / "nodes" / "n.parquet")
    return f"parquet:{tmp_path}"


@pytest.mark.parametrize(("edges", "nodes", "named"), [
    ({"source": [1], "dst": [2]}, None, ["e.parquet", "'src'"]),
    ({"src": [1.5], "dst": [2.0]}, None, ["'src'", "int64"]),
    ({"src": pa.array([1, None]), "dst": [2, 1]}, None, ["'src'", "null", "row 1"]),
    (None, {"name": ["a", "b"], "x": [1.0, 2.0]}, ["n.parquet", "'id'"]),
    (None, {"id": [1, 2], "label": ["cat", "dog"]}, ["'label'", "string"]),
    (None, {"id": [1, 2], "x": pa.array([[1.0, 2.0], [3.0]])}, ["'x'", "ragged", "row 1"]),
    (None, {"id": [1, 2], "x": pa.array([[1.0, None], [3.0, 4.0]])}, ["'x'", "null"]),
    (None, {"id": [1, 2], "y": pa.array([0, None])}, ["'y'", "null"]),
    (None, {"id": [1, 2], "train_mask": [0, 1]}, ["'train_mask'", "bool"]),
    (None, {"id": [1, 2], "w": pa.array([1, 2], pa.uint64())}, ["'w'", "int64"]),
    (None, {"id": [1, 2, 2]}, ["node id 2", "more than once"]),
    (None, {"id": [1, 3]}, ["e.parquet (row group 0)", "src 2 (row 1", "not an id"]),
    (None, {"id": [1, 2], "y": [0, 1], "label": [0, 1]}, ["'label'", "'y'"]),
])
def test_bad_column_is_named(tmp_path, edges, nodes, named) -> None:
    with pytest.raises(InvalidInputError) as info:
        resolve_source(_bad(tmp_path, edges, nodes))
    for part in named:
        assert part in str(info.value), str(info.value)


def test_pandas_index_and_broken_file_are_refused(tmp_path) -> None:
    os.makedirs(tmp_path / "edges")  # the column pandas writes for an unnamed non-range index
    pq.write_table(pa.table({"src": [1, 2], "dst": [2, 1], "__index_level_0__": [7, 3]}), tmp_path / "edges" / "a.parquet")
    with pytest.raises(InvalidInputError, match="index=False"):
        resolve_source(f"parquet:{tmp_path}")
    (tmp_path / "edges" / "a.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InvalidInputError, match="a.parquet is not a readable Parquet file"):
        resolve_source(f"parquet:{tmp_path}")


def test_missing_edges_and_hetero_layout_are_refused(tmp_path) -> None:
    with pytest.raises(SourceNotFoundError, match="no edges directory"):
        resolve_source(f"parquet:{tmp_path}")
    os.makedirs(tmp_path / "edges" / "paper__cites__paper")
    with pytest.raises(InvalidInputError, match="heterogeneous layout"):
        resolve_source(f"parquet:{tmp_path}")


def test_to_undirected_appends_reverse_edges_as_chunks(tmp_path) -> None:
    g = _graph(4)
    src = _write(tmp_path / "in", g)
    graphstore.ingest(f"parquet:{src}", tmp_path / "ds", num_parts=2, method="random", to_undirected=True)
    want = _expected(g)
    s, d = want.edges[None]
    both = Expected(want.num_nodes, want.node_attrs, {None: (np.concatenate([s, d]), np.concatenate([d, s]))},
                    {None: {"weight": np.concatenate([g["weight"], g["weight"]])}})
    assert_roundtrip(graphstore.open_dataset(tmp_path / "ds"), both)


@pytest.mark.s3
def test_s3_source(s3, tmp_path) -> None:
    g = _graph(3)
    local = _write(tmp_path / "in", g)
    s3.fs().put(local + "/", s3.url("graph"), recursive=True)
    chunked = resolve_chunked(f"parquet:{s3.url('graph')}", storage_options=s3.storage_options)
    block = pickle.loads(pickle.dumps(chunked.edge_chunks[0])).read()
    assert len(block.src) == 97
    got = materialize(chunked)
    expected = _expected(g)
    np.testing.assert_array_equal(got.edges[None].src, expected.edges[None][0])
    np.testing.assert_array_equal(got.nodes[None].attrs["x"].take(np.arange(N)), expected.node_attrs[None]["x"])


def test_unchunked_scheme_is_read_whole_and_says_so(tmp_path, caplog) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, edge_index=np.array([[0, 1, 2], [1, 2, 0]]), x=np.eye(3, dtype=np.float32))
    with caplog.at_level("WARNING", logger="graphstore.ingest.sources"):
        chunked = resolve_chunked(f"npz:{path}")
    assert "npz" in caplog.text and "read into this process whole" in caplog.text
    assert len(chunked.edge_chunks) == 1 and chunked.node_schema[None]["x"].shape == (3,)
    g = materialize(pickle.loads(pickle.dumps(chunked)))
    np.testing.assert_array_equal(g.edges[None].dst, [1, 2, 0])
    np.testing.assert_array_equal(g.nodes[None].attrs["x"].take(np.arange(3)), np.eye(3))


@pytest.mark.parametrize("batch", [1, 10**9])
def test_endpoint_union_is_the_same_however_it_is_merged(tmp_path, monkeypatch, batch) -> None:
    from graphstore.ingest import read_parquet as module

    monkeypatch.setattr(module, "UNION_BATCH", batch)
    g = _graph(4)
    root = _write(tmp_path / "in", g, rows=50)
    import shutil

    shutil.rmtree(os.path.join(root, "nodes"))
    got = materialize(read_parquet(root))
    want = np.unique(np.concatenate([g["src"], g["dst"]]))
    np.testing.assert_array_equal(got.nodes[None].attrs["id"].take(np.arange(len(want))), want)
    np.testing.assert_array_equal(want[got.edges[None].src], g["src"])
    np.testing.assert_array_equal(want[got.edges[None].dst], g["dst"])


@pytest.mark.parametrize(("second", "words"), [
    ({"src": [3], "dst": [1], "w": [0.5]}, ["'w' only in b.parquet"]),
    ({"src": [3]}, ["'dst' only in a.parquet"]),
    ({"src": pa.array([3], pa.int32()), "dst": [1], "t": [1]}, ["'t' only in b.parquet",
                                                                 "'src' is int64 in a.parquet but int32 in b.parquet"]),
])
def test_files_with_different_columns_are_named_in_one_line(tmp_path, second, words) -> None:
    os.makedirs(tmp_path / "edges")
    pq.write_table(pa.table({"src": [1, 2], "dst": [2, 1]}), tmp_path / "edges" / "a.parquet")
    pq.write_table(pa.table(second), tmp_path / "edges" / "b.parquet")
    with pytest.raises(InvalidInputError) as info:
        resolve_source(f"parquet:{tmp_path}")
    text = str(info.value)
    assert "\n" not in text and f"{tmp_path}/edges/a.parquet and {tmp_path}/edges/b.parquet have different" in text
    for word in words:
        assert word in text, text


def test_files_with_the_same_columns_in_another_order_are_read(tmp_path) -> None:
    os.makedirs(tmp_path / "edges")
    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 2]}), tmp_path / "edges" / "a.parquet")
    pq.write_table(pa.table({"dst": [0], "src": [2]}), tmp_path / "edges" / "b.parquet")
    got = materialize(resolve_chunked(f"parquet:{tmp_path}"))
    np.testing.assert_array_equal(got.edges[None].src, [0, 1, 2])
    np.testing.assert_array_equal(got.edges[None].dst, [1, 2, 0])
