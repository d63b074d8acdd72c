"""Tests of the readers that turn user data (Planetoid, OGB CSVs, npz, PyG objects) into a GraphSource."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from graphstore.errors import InvalidInputError, SourceNotFoundError
from graphstore.ingest.read_npz import read_npz
from graphstore.ingest.read_ogb import read_ogb
from graphstore.ingest.read_planetoid import read_planetoid
from graphstore.ingest.read_pyg import from_pyg
from graphstore.ingest.source import GraphSource, RowSource

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
CORA_RAW = SHARED_DATA / "planetoid" / "Cora" / "raw"


def _all(rows: RowSource) -> np.ndarray:
    return rows.take(np.arange(rows.shape[0], dtype=np.int64))


# ---------------------------------------------------------------- Planetoid


@pytest.mark.skipif(not CORA_RAW.is_dir(), reason=f"Cora raw files not found at {CORA_RAW}")
def test_read_planetoid_cora() -> None:
    source = read_planetoid(str(CORA_RAW))
    nodes, edges = source.nodes[None], source.edges[None]
    assert (source.name, source.origin, source.is_hetero) == ("cora", f"planetoid:{CORA_RAW}", False)
    assert nodes.num_nodes == 2708 and edges.num_edges == 10556
    assert edges.src.dtype == np.int64 and edges.dst.dtype == np.int64
    assert nodes.attrs["x"].shape == (2708, 1433) and nodes.attrs["x"].dtype == np.float32
    y = _all(nodes.attrs["y"])
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(7))
    sizes = {m: int(_all(nodes.attrs[m]).sum()) for m in ("train_mask", "val_mask", "test_mask")}
    assert sizes == {"train_mask": 140, "val_mask": 500, "test_mask": 1000}
    assert all(nodes.attrs[m].dtype == np.bool_ for m in sizes)


def _fake_planetoid(tmp_path: Path, name: str, skip: tuple[str, ...] = ()) -> Path:
    for suffix in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        if suffix not in skip:
            (tmp_path / f"ind.{name}.{suffix}").write_bytes(b"")
    return tmp_path


def test_read_planetoid_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        read_planetoid(str(tmp_path / "nope"))


def test_read_planetoid_names_every_missing_file(tmp_path: Path) -> None:
    _fake_planetoid(tmp_path, "cora", skip=("graph", "test.index"))
    with pytest.raises(SourceNotFoundError, match=r"ind\.cora\.graph, ind\.cora\.test\.index"):
        read_planetoid(str(tmp_path))


def test_read_planetoid_two_names(tmp_path: Path) -> None:
    _fake_planetoid(tmp_path, "cora")
    _fake_planetoid(tmp_path, "pubmed")
    with pytest.raises(InvalidInputError, match=r"\['cora', 'pubmed'\]"):
        read_planetoid(str(tmp_path))


def test_read_planetoid_no_files(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("nothing here")
    with pytest.raises(SourceNotFoundError, match="no Planetoid files"):
        read_planetoid(str(tmp_path))


def test_read_planetoid_corrupt_pickle(tmp_path: Path) -> None:
    _fake_planetoid(tmp_path, "cora")  # all files empty: unpickling fails
    with pytest.raises(InvalidInputError, match="cannot decode"):
        read_planetoid(str(tmp_path))


# ---------------------------------------------------------------- OGB

EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]], dtype=np.int64)
FEATS = np.arange(5 * 3, dtype=np.float32).reshape(5, 3) / 4
EDGE_FEATS = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)


def _write_csv_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _rows_text(array: np.ndarray) -> list[str]:
    return [",".join(str(v) for v in row) for row in array.tolist()]


def _fake_ogb(root: Path, schemes: tuple[str, ...] = ("time",), num_nodes: bool = True) -> Path:
    raw = root / "raw"
    _write_csv_gz(raw / "edge.csv.gz", _rows_text(EDGES))
    _write_csv_gz(raw / "node-feat.csv.gz", _rows_text(FEATS))
    _write_csv_gz(raw / "node-label.csv.gz", ["3", "nan", "0", "1", "2"])
    _write_csv_gz(raw / "edge-feat.csv.gz", _rows_text(EDGE_FEATS))
    if num_nodes:
        _write_csv_gz(raw / "num-node-list.csv.gz", ["5"])
    for scheme in schemes:
        # node 1 (label nan, stored as -1) is in no split: a negative label inside a mask is refused at ingest
        for part, ids in (("train", ["0"]), ("valid", ["2"]), ("test", ["3", "4"])):
            _write_csv_gz(root / "split" / scheme / f"{part}.csv.gz", ids)
    return root


def test_read_ogb_round_trip(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    source = read_ogb(str(_fake_ogb(tmp_path / "ogbn_arxiv")), scratch_dir=str(scratch))
    nodes, edges = source.nodes[None], source.edges[None]
    assert (source.name, source.origin) == ("ogbn_arxiv", f"ogb:{tmp_path / 'ogbn_arxiv'}")
    assert nodes.num_nodes == 5
    np.testing.assert_array_equal(np.stack([edges.src, edges.dst], axis=1), EDGES)
    x = nodes.attrs["x"]
    assert x.dtype == np.float32 and x.shape == (5, 3)
    np.testing.assert_array_equal(x.take(np.array([4, 0, 2])), FEATS[[4, 0, 2]])
    assert isinstance(x._array, np.memmap)  # spilled to disk, not held in memory
    np.testing.assert_array_equal(_all(nodes.attrs["y"]), [3, -1, 0, 1, 2])
    assert nodes.attrs["y"].dtype == np.int64
    np.testing.assert_array_equal(_all(nodes.attrs["train_mask"]), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(_all(nodes.attrs["val_mask"]), [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(_all(nodes.attrs["test_mask"]), [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(_all(edges.attrs["edge_attr"]), EDGE_FEATS)
    temp_dirs = os.listdir(scratch)
    assert len(temp_dirs) == 1
    source.close()
    assert os.listdir(scratch) == []


def test_read_ogb_to_undirected(tmp_path: Path) -> None:
    directory = _fake_ogb(tmp_path / "ogbn_products", num_nodes=False)
    with read_ogb(str(directory)) as source:  # inferred from the name
        edges = source.edges[None]
        assert edges.num_edges == 2 * len(EDGES)
        np.testing.assert_array_equal(edges.src, np.concatenate([EDGES[:, 0], EDGES[:, 1]]))
        np.testing.assert_array_equal(edges.dst, np.concatenate([EDGES[:, 1], EDGES[:, 0]]))
        attr = edges.attrs["edge_attr"]
        assert attr.shape == (10, 2)
        np.testing.assert_array_equal(attr.take(np.array([0, 5, 9])), EDGE_FEATS[[0, 0, 4]])
        assert source.nodes[None].num_nodes == 5  # inferred without num-node-list
    with read_ogb(str(directory), to_undirected=False) as source:
        assert source.edges[None].num_edges == len(EDGES)


def test_read_ogb_split_schemes(tmp_path: Path) -> None:
    directory = str(_fake_ogb(tmp_path / "ds", schemes=("time", "random")))
    with pytest.raises(InvalidInputError, match=r"\['random', 'time'\]"):
        read_ogb(directory)
    with read_ogb(directory, split_scheme="random") as source:
        assert int(_all(source.nodes[None].attrs["test_mask"]).sum()) == 2
    with pytest.raises(SourceNotFoundError, match="'species'"):
        read_ogb(directory, split_scheme="species")


def test_read_ogb_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        read_ogb(str(tmp_path / "missing"))
    (tmp_path / "empty" / "raw").mkdir(parents=True)
    with pytest.raises(SourceNotFoundError, match=r"edge\.csv\.gz"):
        read_ogb(str(tmp_path / "empty"))
    directory = _fake_ogb(tmp_path / "bad")
    _write_csv_gz(directory / "raw" / "edge.csv.gz", ["0,1", "1,x"])
    with pytest.raises(InvalidInputError, match=r"edge\.csv\.gz"):
        read_ogb(str(directory))


def test_read_ogb_too_many_feature_rows_cleans_up(tmp_path: Path) -> None:
    directory = _fake_ogb(tmp_path / "ds")
    _write_csv_gz(directory / "raw" / "num-node-list.csv.gz", ["4"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(InvalidInputError, match="more than 4 rows"):
        read_ogb(str(directory), scratch_dir=str(scratch))
    assert os.listdir(scratch) == []


# ---------------------------------------------------------------- npz

NPZ_EDGE_INDEX = np.array([[0, 1, 2, 3], [1, 2, 3, 0]], dtype=np.int32)


def _npz_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "edge_index": NPZ_EDGE_INDEX,
        "x": rng.random((4, 3), dtype=np.float32),
        "y": np.array([0, 1, 1, 0], dtype=np.int64),
        "train_mask": np.array([True, False, True, False]),
        "node_time": np.arange(4, dtype=np.int64),
        "node_degree": np.array([1, 1, 1, 1], dtype=np.int16),
        "edge_weight": np.linspace(0, 1, 4, dtype=np.float32),
        "edge_kind": np.array([0, 1, 0, 1], dtype=np.int8),
    }


def _check_npz_source(source: GraphSource, arrays: dict[str, np.ndarray]) -> None:
    nodes, edges = source.nodes[None], source.edges[None]
    assert nodes.num_nodes == 4
    assert sorted(nodes.attrs) == ["degree", "time", "train_mask", "x", "y"]
    assert sorted(edges.attrs) == ["kind", "weight"]
    assert edges.src.dtype == np.int64
    np.testing.assert_array_equal(edges.src, NPZ_EDGE_INDEX[0])
    np.testing.assert_array_equal(edges.dst, NPZ_EDGE_INDEX[1])
    np.testing.assert_array_equal(_all(nodes.attrs["x"]), arrays["x"])
    np.testing.assert_array_equal(_all(nodes.attrs["time"]), arrays["node_time"])
    np.testing.assert_array_equal(_all(edges.attrs["kind"]), arrays["edge_kind"])
    assert nodes.attrs["degree"].dtype == np.int16 and edges.attrs["weight"].dtype == np.float32


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_read_npz_file(tmp_path: Path, save: object) -> None:
    arrays = _npz_arrays()
    save(tmp_path / "g.npz", **arrays)  # type: ignore[operator]
    source = read_npz(str(tmp_path / "g.npz"))
    assert (source.name, source.origin) == ("g", f"npz:{tmp_path / 'g.npz'}")
    _check_npz_source(source, arrays)


def test_read_npz_directory_is_memory_mapped(tmp_path: Path) -> None:
    arrays = _npz_arrays()
    for key, value in arrays.items():
        np.save(tmp_path / f"{key}.npy", value)
    source = read_npz(str(tmp_path))
    _check_npz_source(source, arrays)
    assert isinstance(source.nodes[None].attrs["x"]._array, np.memmap)


def test_read_npz_num_nodes(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", edge_index=NPZ_EDGE_INDEX, num_nodes=np.int64(9))
    assert read_npz(str(tmp_path / "a.npz")).nodes[None].num_nodes == 9
    np.savez(tmp_path / "b.npz", edge_index=NPZ_EDGE_INDEX)
    assert read_npz(str(tmp_path / "b.npz")).nodes[None].num_nodes == 4  # edge_index.max() + 1


def test_read_npz_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        read_npz(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "unknown.npz", edge_index=NPZ_EDGE_INDEX, feats=np.ones((4, 2)))
    with pytest.raises(InvalidInputError, match=r"unknown key 'feats'.*edge_index \(required\)"):
        read_npz(str(tmp_path / "unknown.npz"))
    np.savez(tmp_path / "shape.npz", edge_index=NPZ_EDGE_INDEX.T)
    with pytest.raises(InvalidInputError, match=r"shape \(4, 2\).*\(2, E\)"):
        read_npz(str(tmp_path / "shape.npz"))
    np.savez(tmp_path / "noedges.npz", x=np.ones((4, 2)))
    with pytest.raises(InvalidInputError, match="no edge_index"):
        read_npz(str(tmp_path / "noedges.npz"))
    np.savez(tmp_path / "clash.npz", edge_index=NPZ_EDGE_INDEX, x=np.ones(4), node_x=np.ones(4))
    with pytest.raises(InvalidInputError, match="'node_x' .* both name node attribute 'x'"):
        read_npz(str(tmp_path / "clash.npz"))
    (tmp_path / "not.npz").write_text("hello")
    with pytest.raises(InvalidInputError, match="not an .npz archive"):
        read_npz(str(tmp_path / "not.npz"))


# ---------------------------------------------------------------- PyG


def test_from_pyg_data() -> None:
    data = Data(
        x=torch.rand(4, 3),
        y=torch.tensor([0, 1, 0, 1]),
        train_mask=torch.tensor([True, False, True, False]),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        edge_weight=torch.tensor([0.5, 1.0, 2.0]),
    )
    source = from_pyg(data)
    nodes, edges = source.nodes[None], source.edges[None]
    assert not source.is_hetero and nodes.num_nodes == 4
    assert sorted(nodes.attrs) == ["train_mask", "x", "y"] and sorted(edges.attrs) == ["edge_weight"]
    np.testing.assert_array_equal(_all(nodes.attrs["x"]), data.x.numpy())
    assert nodes.attrs["y"].dtype == np.int64 and nodes.attrs["train_mask"].dtype == np.bool_
    np.testing.assert_array_equal(edges.src, [0, 1, 2])
    np.testing.assert_array_equal(_all(edges.attrs["edge_weight"]), [0.5, 1.0, 2.0])


def test_from_pyg_hetero() -> None:
    data = HeteroData()
    data["paper"].x = torch.rand(3, 4)
    data["paper"].y = torch.tensor([0, 1, 2])
    data["author"].num_nodes = 2
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 1], [0, 1, 2]])
    data["author", "writes", "paper"].edge_attr = torch.rand(3, 2)
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 2], [1, 1]])
    source = from_pyg(data)
    assert source.is_hetero
    assert {t: n.num_nodes for t, n in source.nodes.items()} == {"paper": 3, "author": 2}
    assert sorted(source.nodes["paper"].attrs) == ["x", "y"] and source.nodes["author"].attrs == {}
    writes = source.edges[("author", "writes", "paper")]
    np.testing.assert_array_equal(writes.dst, [0, 1, 2])
    np.testing.assert_array_equal(_all(writes.attrs["edge_attr"]), data["writes"].edge_attr.numpy())
    assert source.edges[("paper", "cites", "paper")].attrs == {}


def test_from_pyg_errors() -> None:
    with pytest.raises(InvalidInputError, match="no edge_index"):
        from_pyg(Data(x=torch.rand(3, 2)))
    with pytest.raises(InvalidInputError, match="shape"):
        from_pyg(Data(x=torch.rand(3, 2), edge_index=torch.tensor([0, 1, 2])))
    adj = Data(x=torch.rand(3, 2))
    adj.adj_t = torch.eye(3).to_sparse()
    with pytest.raises(InvalidInputError, match="adj_t.*edge_index"):
        from_pyg(adj)
    hetero = HeteroData()
    hetero["a"].x = torch.rand(2, 2)
    hetero["a", "to", "b"].edge_index = torch.tensor([[0], [0]])
    with pytest.raises(InvalidInputError, match="'b'"):
        from_pyg(hetero)
    hetero["b"].label = "no tensors"
    with pytest.raises(InvalidInputError, match="number of nodes of node type 'b'"):
        from_pyg(hetero)
    with pytest.raises(InvalidInputError, match="Data or HeteroData"):
        from_pyg({"edge_index": [[0], [1]]})

