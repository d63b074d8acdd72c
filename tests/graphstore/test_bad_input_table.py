"""Bad input and damaged data, one row each: exit code, a word of the one-line message, nothing touched.

A row of ``CLI_CASES`` is (arguments, expected exit code, a word the error must contain). ``{d}`` is a
directory of input files shared by every row (its bytes must be unchanged afterwards), ``{t}`` the
row's own empty directory (it must still be empty afterwards: nothing written, nothing left behind).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import shutil
import socket
import subprocess
import zlib

import numpy as np
import pytest

import graphstore
from graphstore.cli.app import main
from graphstore.errors import CorruptDatasetError, DatasetExistsError, InvalidInputError
from graphstore.storage.integrity import check_csc
from tests.graphstore.test_readers import FEATS, _fake_ogb, _rows_text, _write_csv_gz

EI = np.array([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])

CLI_CASES = [
    # DEST safety: a file, above all the SOURCE itself, is never moved, renamed or overwritten
    (["ingest", "npz:{d}/g.npz", "{d}/g.npz"], 2, "is a file"),
    (["ingest", "npz:{d}/g.npz", "{d}/notes.txt", "--overwrite"], 2, "is a file"),
    (["ingest", "npz:{d}/npy", "{d}/npy/ds"], 2, "overlaps the SOURCE"),
    (["ingest", "npz:{d}/npy", "{d}/npy"], 2, "overlaps the SOURCE"),
    (["ingest", "npz:{d}/g.npz", "{d}/notes.txt/ds"], 2, "is a file"),
    (["ingest", "npz:{d}/g.npz", "{d}"], 2, "overlaps the SOURCE"),
    (["ingest", "synthetic:nodes=100", "{d}", "--overwrite"], 2, "not a graphstore dataset"),
    # inputs whose meaning is wrong: refused at ingest, not mid-training
    (["ingest", "npz:{d}/float_y.npz", "{t}/o"], 2, "integer class"),
    (["ingest", "npz:{d}/x_1d.npz", "{t}/o"], 2, "2-D"),
    (["ingest", "npz:{d}/int_mask.npz", "{t}/o"], 2, "bool"),
    (["ingest", "npz:{d}/huge_ids.npz", "{t}/o"], 2, "remap"),
    (["ingest", "npz:{d}/no_nodes.npz", "{t}/o"], 2, "no nodes"),
    (["ingest", "synthetic:nodes=10,classes=50", "{t}/o"], 2, "classes <= nodes"),
    (["ingest", "synthetic-mag:papers=10,classes=50", "{t}/o"], 2, "classes <= papers"),
    (["ingest", "synthetic:nodes=1000,avg_degree=1e12", "{t}/o"], 2, "avg_degree"),
    (["ingest", "synthetic:nodes=100,avg_degree=nan", "{t}/o"], 2, "finite"),
    # flags: finite and in range, refused by the parser
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--chunk-mb", "nan"], 2, "--chunk-mb"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--chunk-mb", "inf"], 2, "--chunk-mb"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--chunk-mb", "-1"], 2, "--chunk-mb"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--parts", "0"], 2, "--parts"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--seed", "-1"], 2, "--seed"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--metis-max-edges", "-5"], 2, "--metis-max-edges"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--parts", "7"], 2, "--parts 6 or fewer"),
    (["ingest", "ogb:{d}/ogb", "{t}/o"], 2, "keep only the one to use"),  # names no missing flag
    # a short line in an OGB CSV is named as such (pandas would fill it with NaN: "NaN features", or label -1)
    (["ingest", "ogb:{d}/ogb_short_feat", "{t}/o"], 2, "node-feat.csv.gz' line 3 has 2 values; the first line has 3"),
    (["ingest", "ogb:{d}/ogb_short_label", "{t}/o"], 2, "node-label.csv.gz' line 4 has 1 values; the first line has 2"),
    (["ingest", "ogb:{d}/ogb_nan_feat", "{t}/o"], 2, "NaN"),  # a real nan in a full line: the NaN refusal
    # labels inside [0, classes) wherever a mask uses them; a negative label outside every mask is "unlabelled"
    (["ingest", "npz:{d}/neg_y_train.npz", "{t}/o"], 2, "attribute 'y': node 2 is in train_mask but has label -5"),
    (["ingest", "npz:{d}/neg_y_val.npz", "{t}/o"], 2, "node 4 is in val_mask but has label -1 (2 such nodes among"),
    (["ingest", "npz:{d}/neg_y_test_2d.npz", "{t}/o"], 2, "node 5 is in test_mask but has label -1"),
    # what would make a dataset that fails its own verify (and the training door): refused at ingest
    (["ingest", "npz:{d}/x_no_columns.npz", "{t}/o"], 2, "has shape [6, 0]: features of width 0 give a model no input"),
    (["ingest", "npz:{d}/huge_class.npz", "{t}/o"], 2,
     "attribute 'y': node 3 has label 10,000,000, so a model would need 10,000,001 output classes"),
    (["ingest", "npz:{d}/no_train.npz", "{t}/o"], 2, "attribute 'train_mask': no node is in it"),
    # counts >= 0 before anything is derived from them (not blamed on --parts)
    (["ingest", "npz:{d}/neg_num_nodes.npz", "{t}/o"], 2, "the nodes: num_nodes is -1"),
    (["ingest", "npz:{d}/neg_num_nodes.npz", "{t}/o", "--parts", "2"], 2, "num_nodes is -1"),
    # every per-node / per-edge array of the wrong length is named itself, never a neighbour
    (["ingest", "npz:{d}/short_node_time.npz", "{t}/o"], 2, "'node_time' has 5 rows, but 'test_mask', 'y' have 6"),
    (["ingest", "npz:{d}/short_y.npz", "{t}/o"], 2, "node attribute 'y' has 5 rows, but 'train_mask', 'x' have 6"),
    (["ingest", "npz:{d}/short_mask.npz", "{t}/o"], 2, "node attribute 'train_mask' has 4 rows"),
    (["ingest", "npz:{d}/two_short.npz", "{t}/o"], 2, "'node_time' has 5 rows and 'x' has 4 rows, but 'y' has 6"),
    (["ingest", "npz:{d}/short_x_counted.npz", "{t}/o"], 2, "attribute 'x' has 5 rows but num_nodes is 6"),
    (["ingest", "npz:{d}/short_edge_time.npz", "{t}/o"], 2, "the edges, attribute 'time' has 5 rows but the edge"),
    # DEST places that would land data where nobody meant it, or cannot hold it
    (["ingest", "npz:{d}/g.npz", "{t}/not/there/o"], 2, "its parent directory {t}/not/there does not exist"),
    (["ingest", "npz:{d}/g.npz", "/proc/graphstore-test-ds"], 2, "DEST /proc/graphstore-test-ds"),
    # Dask flags checked at the door: a worker that cannot live, a scheduler nobody listens on
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--memory-limit", "1KB"], 2, "below 328 MiB"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--memory-limit", "200MiB"], 2, "below 328 MiB"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--scheduler", "tcp://127.0.0.1:1"], 2,
     "--scheduler tcp://127.0.0.1:1: cannot connect to 127.0.0.1:1"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--scheduler", "tcp://localhost:port"], 2,
     "is not an address"),
    (["info", "{t}/missing"], 2, "no graphstore dataset"),
    (["verify", "{d}/npy"], 2, "no graphstore dataset"),
    # a LocalCluster the machine cannot hold is refused before any worker process starts
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--workers", "100000"], 2, "--workers 100000 is more "
                                                                                         "than 4 per core"),
    (["ingest", "npz:{d}/g.npz", "{t}/o", "--engine", "dask", "--workers", "1", "--memory-limit", "1000TB"], 2,
     "is more than this machine's"),
    # a metrics file the plot cannot read: named, never a traceback
    (["plot", "{d}/m_nan_text.json", "-o", "{t}/p.png"], 2, "epoch record 1: 'loss' is 'NaN', not a number"),
    (["plot", "{d}/m_string_epoch.json", "-o", "{t}/p.png"], 2, "'epoch' is 'one', not a number"),
    (["plot", "{d}/m_string_timing.json", "-o", "{t}/p.png"], 2, "'timing.data_wait' is '1s', not a number"),
    (["plot", "{d}/m_deep.json", "-o", "{t}/p.png"], 2, "cannot be read as JSON (nested too deeply)"),
    (["plot", "{d}/m_list.json", "-o", "{t}/p.png"], 2, "no list of epoch records"),
    (["plot", "{d}/m_config.json", "-o", "{t}/p.png"], 2, "'config' is str, not an object"),
    # the user's files inside a dataset folder: never written there, never deleted by --overwrite
    (["info", "{d}/ds", "--plot", "{d}/ds/parts.png"], 2, "--plot {d}/ds/parts.png is inside the dataset folder"),
    (["plot", "{d}/m_good.json", "-o", "{d}/ds/part_00000/m.png"], 2, "is inside the dataset folder"),
    (["ingest", "npz:{d}/g.npz", "{d}/ds_notes", "--overwrite"], 2, "holds 'notes.txt' that graphstore did not write"),
]


def _digest(root: str) -> dict[str, str]:
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("inputs")
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.savez(d / "g.npz", edge_index=EI, x=x, y=np.array([0, 1, 0, 1, 0, 1]))
    np.savez(d / "float_y.npz", edge_index=EI, y=np.array([0.5, 1, 0, 1, 0, 1]))
    np.savez(d / "x_1d.npz", edge_index=EI, x=np.arange(6, dtype=np.float32))
    np.savez(d / "int_mask.npz", edge_index=EI, train_mask=np.array([1, 0, 1, 0, 1, 0]))
    np.savez(d / "huge_ids.npz", edge_index=np.array([[0, 10**12], [1, 2]]))
    np.savez(d / "no_nodes.npz", edge_index=np.zeros((2, 0), np.int64), num_nodes=np.int64(0))
    _label_and_length_inputs(d, x)
    (d / "notes.txt").write_text("precious")
    (d / "npy").mkdir()
    np.save(d / "npy" / "edge_index.npy", EI)
    _fake_ogb(d / "ogb", schemes=("time", "random"))
    for name, file, lines in _ogb_variants():
        _write_csv_gz(_fake_ogb(d / name) / "raw" / file, lines)
    _metrics_inputs(d)
    graphstore.ingest(f"npz:{d}/g.npz", d / "ds", method="random")
    graphstore.ingest(f"npz:{d}/g.npz", d / "ds_notes", method="random")
    (d / "ds_notes" / "notes.txt").write_text("mine, not graphstore's")
    return str(d)


def _metrics_inputs(d) -> None:
    """Metrics files graphstore-train did not write: text where numbers go, deep nesting, no object."""
    good = {"epoch": 1, "loss": 0.5, "train_seconds": 1.0, "timing": {"data_wait": 0.1}}
    docs = {"m_good": {"epochs": [good]},
            "m_nan_text": {"epochs": [good, {**good, "epoch": 2, "loss": "NaN"}]},
            "m_string_epoch": {"epochs": [{**good, "epoch": "one"}]},
            "m_string_timing": {"epochs": [{**good, "timing": {"data_wait": "1s"}}]},
            "m_config": {"config": "sage", "epochs": [good]}}
    for name, doc in docs.items():
        (d / f"{name}.json").write_text(json.dumps(doc))
    (d / "m_list.json").write_text("[1, 2, 3]")
    (d / "m_deep.json").write_text('{"epochs": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _label_and_length_inputs(d, x: np.ndarray) -> None:
    """Archives with a negative label inside a mask, a negative count, and node/edge arrays one short."""
    y, on, off = np.array([0, 1, -5, 1, -1, -1]), np.ones(6, bool), np.zeros(6, bool)
    np.savez(d / "neg_y_train.npz", edge_index=EI, x=x, y=y, train_mask=on)
    np.savez(d / "neg_y_val.npz", edge_index=EI, x=x, y=y, train_mask=[1, 1, 0, 1, 0, 0] == on,
             val_mask=[0, 0, 0, 0, 1, 1] == on)
    np.savez(d / "neg_y_test_2d.npz", edge_index=EI, y=np.array([[0, 1]] * 5 + [[1, -1]]), train_mask=off,
             test_mask=[0, 0, 0, 0, 0, 1] == on)
    np.savez(d / "neg_num_nodes.npz", edge_index=EI, num_nodes=np.int64(-1))
    np.savez(d / "short_node_time.npz", edge_index=EI, y=y.clip(0), test_mask=on, node_time=np.arange(5))
    np.savez(d / "short_y.npz", edge_index=EI, x=x, y=y[:5].clip(0), train_mask=on)
    np.savez(d / "short_mask.npz", edge_index=EI, x=x, y=y.clip(0), train_mask=on[:4])
    np.savez(d / "two_short.npz", edge_index=EI, x=x[:4], y=y.clip(0), node_time=np.arange(5))
    np.savez(d / "short_x_counted.npz", edge_index=EI, x=x[:5], num_nodes=np.int64(6))
    np.savez(d / "short_edge_time.npz", edge_index=EI, x=x, edge_time=np.arange(5))
    np.savez(d / "x_no_columns.npz", edge_index=EI, x=np.zeros((6, 0), np.float32))
    np.savez(d / "huge_class.npz", edge_index=EI, x=x, y=np.array([0, 1, 0, 10**7, 0, 1]), train_mask=on)
    np.savez(d / "no_train.npz", edge_index=EI, x=x, y=y.clip(0), train_mask=off)


def _ogb_variants() -> list[tuple[str, str, list[str]]]:
    """OGB directories with one CSV changed: a short feature line, a short label line, a real nan."""
    feats = _rows_text(FEATS)
    return [("ogb_short_feat", "node-feat.csv.gz", feats[:2] + ["1.0,2.0"] + feats[3:]),
            ("ogb_short_label", "node-label.csv.gz", ["3,1", "nan,nan", "0,1", "1", "2,0"]),
            ("ogb_nan_feat", "node-feat.csv.gz", feats[:2] + ["1.0,nan,2.0"] + feats[3:])]


def test_a_real_nan_in_a_full_ogb_line_is_data_not_a_short_line(inputs, tmp_path):
    summary = graphstore.ingest(f"ogb:{inputs}/ogb_nan_feat", tmp_path / "o", allow_nan=True)
    x = graphstore.open_dataset(summary.dest).partition(0)[0][None, "x", None].numpy()
    assert np.isnan(x).sum() == 1


@pytest.mark.parametrize("argv,code,word", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_cli_bad_input(inputs, tmp_path, capsys, argv, code, word):
    before = _digest(inputs)
    args = [a.format(d=inputs, t=tmp_path) for a in argv]
    assert main(args) == code
    err = capsys.readouterr().err.strip()
    assert word.format(t=tmp_path, d=inputs) in err, err
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    assert _digest(inputs) == before, "an input file was changed, moved or removed"
    assert sorted(os.listdir(inputs)) == sorted(before_names(before)), "something was left beside the inputs"
    assert os.listdir(tmp_path) == [], "something was written"


def before_names(digest: dict[str, str]) -> set[str]:
    return {path.split(os.sep)[0] for path in digest}


def _pyg(**attrs):
    import torch
    from torch_geometric.data import Data

    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])  # 6 nodes, 7 edges
    return Data(edge_index=edge_index, **{k: torch.as_tensor(v, dtype=torch.bool if k.endswith("_mask") else None)
                                          for k, v in attrs.items()})


def _pyg_hetero(y):
    import torch
    from torch_geometric.data import HeteroData

    data = HeteroData()
    data["paper"].x, data["paper"].y = torch.ones(4, 2), torch.tensor(y)
    data["paper"].val_mask = torch.tensor([False, True, True, False])
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    return data


def _chunked(y, train_mask, num_nodes=None, num_edges=None):
    """A ChunkedSource of a 10-node ring cut into node chunks of 3: per-chunk checks see one chunk."""
    from graphstore.ingest.chunked_graph import chunked_from_graph
    from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable

    n = len(y)
    attrs = {"x": np.ones((n, 2), np.float32), "y": np.array(y), "train_mask": np.array(train_mask, bool)}
    graph = GraphSource({None: NodeTable(n, {k: ArrayRows(v) for k, v in attrs.items()})},
                        {None: EdgeTable(np.arange(n), (np.arange(n) + 1) % n)})
    source = chunked_from_graph(graph, chunk_edges=4, chunk_nodes=3)
    source.num_nodes = {None: n if num_nodes is None else num_nodes}
    source.num_edges = {None: n if num_edges is None else num_edges}
    return source


Y10 = [0, 1, 0, 1, 0, 1, 0, -5, 1, 0]
ONES, TRAIN7 = [1] * 6, [i in (0, 7) for i in range(10)]
# (id, the graph handed to graphstore.ingest, words of the one-line InvalidInputError)
SOURCE_CASES = [
    ("pyg -5 in train_mask", lambda: _pyg(x=np.ones((6, 2), np.float32), y=[0, 1, -5, 0, 1, 0], train_mask=ONES),
     "the nodes, attribute 'y': node 2 is in train_mask but has label -5"),
    ("pyg hetero -1 in val_mask", lambda: _pyg_hetero([0, 1, -1, 2]),
     "node type 'paper', attribute 'y': node 2 is in val_mask but has label -1"),
    ("pyg num_nodes=-1", lambda: _pyg(x=np.ones((6, 2), np.float32), num_nodes=-1), "num_nodes is -1"),
    ("pyg short node_time", lambda: _pyg(y=[0] * 6, train_mask=ONES, node_time=np.arange(5)),
     "'data.node_time' has 5 rows, but 'data.y', 'data.train_mask' have 6"),
    ("pyg short x", lambda: _pyg(x=np.ones((5, 2), np.float32), y=[0] * 6), "'data.x' has 5 rows, but 'data.y' has 6"),
    ("pyg long y", lambda: _pyg(x=np.ones((6, 2), np.float32), y=[0] * 7), "'data.y' has 7 rows, but 'data.x' has 6"),
    ("pyg short y, num_nodes set", lambda: _pyg(x=np.ones((6, 2), np.float32), y=[0] * 5, num_nodes=6),
     "attribute 'y' has 5 rows but num_nodes is 6"),
    ("pyg short mask", lambda: _pyg(x=np.ones((6, 2), np.float32), y=[0] * 6, test_mask=ONES[:5]),
     "'data.test_mask' has 5 rows"),
    ("chunked -5 in train_mask", lambda: _chunked(Y10, TRAIN7),
     "attribute 'y': node 7 is in train_mask but has label -5 (1 such node among nodes 6..8)"),
    ("chunked num_nodes=-3", lambda: _chunked(Y10, TRAIN7, num_nodes=-3), "the nodes: num_nodes is -3"),
    ("chunked num_edges=-1", lambda: _chunked(Y10, TRAIN7, num_edges=-1), "the edges: num_edges is -1"),
]


@pytest.mark.parametrize("case,make,words", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_source_bad_values(tmp_path, case, make, words):
    with pytest.raises(InvalidInputError) as info:
        graphstore.ingest(make(), tmp_path / "o")
    assert words in str(info.value) and len(str(info.value).splitlines()) == 1, str(info.value)
    assert os.listdir(tmp_path) == [], "something was written"


UNLABELLED = [lambda: _pyg(x=np.ones((6, 2), np.float32), y=[0, -1, 1, -1, 0, 1], train_mask=[1, 0, 1, 0, 1, 1]),
              lambda: _chunked([-1 if i % 3 else 0 for i in range(10)], [i % 3 == 0 for i in range(10)]),
              lambda: _pyg_hetero([0, 1, 2, -1])]


@pytest.mark.parametrize("make", UNLABELLED, ids=["pyg", "chunked", "hetero"])
def test_negative_labels_outside_every_mask_are_unlabelled_nodes(tmp_path, make):
    summary = graphstore.ingest(make(), tmp_path / "o")
    ds = graphstore.open_dataset(summary.dest)
    ntype = ds.node_types[0]
    assert (ds.partition(0)[0][ntype, "y", None].numpy() == -1).sum() >= 1


def test_s3_dest_that_is_an_object_is_refused(s3, inputs):
    """Object storage: a key that exists and is not a dataset is never deleted or replaced."""
    fs = s3.fs()
    fs.pipe(f"{s3.bucket}/mine", b"precious")
    options = {"client_kwargs": {"endpoint_url": s3.endpoint}}
    with pytest.raises(DatasetExistsError, match="not a graphstore dataset"):
        graphstore.ingest(f"npz:{inputs}/g.npz", s3.url("mine"), storage_options=options, overwrite=True)
    assert fs.cat(f"{s3.bucket}/mine") == b"precious"


# -- damaged data: flipped bytes in stored chunks --

@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("ds") / "ds"
    graphstore.ingest("synthetic:nodes=3000,avg_degree=6,features=8,classes=3,seed=2", d, num_parts=2,
                      chunk_mb=0.01)
    return str(d)


@pytest.fixture
def damaged(dataset_dir, tmp_path) -> str:
    copy = str(tmp_path / "ds")
    shutil.copytree(dataset_dir, copy)
    return copy


def _flip(root: str, path: str, chunk: int, offset: int = 8, ndim: int = 1) -> None:
    file = os.path.join(root, path, "c", str(chunk), *["0"] * (ndim - 1))
    raw = bytearray(open(file, "rb").read())
    raw[offset] ^= 0x5A
    raw[offset + 1] ^= 0xA5
    with open(file, "wb") as fh:
        fh.write(raw)


TOPOLOGY_CASES = [("indptr", 0, 1), ("indices", 1, 1), ("eid", 0, 1), ("packed", 1, 2)]


@pytest.mark.parametrize("name,chunk,ndim", TOPOLOGY_CASES)
def test_flipped_topology_bytes_are_caught_at_open(damaged, name, chunk, ndim):
    path = f"part_00001/edges/_N/{name}"
    assert graphstore.open_dataset(damaged).manifest.arrays[path].num_chunks > chunk
    _flip(damaged, path, chunk, ndim=ndim)
    _, gs = graphstore.open_dataset(damaged).partition(1)
    with pytest.raises(CorruptDatasetError, match=rf"chunk {chunk} of {path} .* fails its checksum"):
        gs.csc_arrays()
    graphstore.open_dataset(damaged).partition(0)[1].csc_arrays()  # the other partition is fine


@pytest.mark.parametrize("verify_reads", [False, True])
def test_flipped_feature_bytes_stop_reads_only_when_verified(damaged, verify_reads):
    path = "part_00000/nodes/_N/x"
    _flip(damaged, path, 1, ndim=2)
    fs, _ = graphstore.open_dataset(damaged, verify_reads=verify_reads).partition(0)
    if verify_reads:
        with pytest.raises(CorruptDatasetError, match=rf"chunk 1 of {path} .* fails its checksum"):
            fs[None, "x", None]
    else:
        assert fs[None, "x", None].shape[1] == 8  # served unchecked: the documented default


def test_verify_reads_survives_pickling(dataset_dir):
    import pickle

    assert pickle.loads(pickle.dumps(graphstore.open_dataset(dataset_dir, verify_reads=True))).verify_reads


def test_chunk_files_checked_before_ranks_start(damaged):
    ds = graphstore.open_dataset(damaged)
    ds.check_chunk_files()
    os.remove(os.path.join(damaged, "part_00001", "nodes", "_N", "y", "c", "0"))
    with pytest.raises(CorruptDatasetError, match=r"chunk 0 of part_00001/nodes/_N/y is missing"):
        ds.check_chunk_files()


def set_stored(root: str, path: str, rows: list[int] | None, value: object) -> None:
    """Set ``rows`` (``None``: all) of stored array ``path`` to ``value`` and re-sign the chunks in the manifest:
    damage with valid checksums (another writer, a hand-edited manifest), only the values can show it."""
    meta = os.path.join(root, "zarr.json")
    with open(meta) as fh:
        doc = json.load(fh)
    info = doc["attributes"]["graphstore"]["arrays"][path]
    rows = list(range(info["shape"][0])) if rows is None else rows
    for chunk in sorted({r // info["chunk_rows"] for r in rows}):
        file = os.path.join(root, path, "c", str(chunk), *["0"] * (len(info["shape"]) - 1))
        data = np.fromfile(file, info["dtype"]).reshape(-1, *info["shape"][1:])
        data[[r % info["chunk_rows"] for r in rows if r // info["chunk_rows"] == chunk]] = value
        data.tofile(file)
        with open(file, "rb") as fh:
            info["checksums"][chunk] = f"crc32:{zlib.crc32(fh.read()):08x}"
    with open(meta, "w") as fh:
        json.dump(doc, fh)


def first_train_row(root: str, part: int) -> int:
    mask = np.asarray(graphstore.open_dataset(root).array(f"part_{part:05d}/nodes/_N/train_mask"))
    return int(np.flatnonzero(mask)[0])


# (id, what is set in which stored arrays (path, rows or None for all, value), words of the one-line problem);
# {r} is the first training row of partition 1
STORED_CASES = [
    ("label -7 on a training node", [("part_00001/nodes/_N/y", "r", -7)],
     "the nodes, array part_00001/nodes/_N/y: row {r} is in train_mask but has label -7"),
    ("label 10**7", [("part_00000/nodes/_N/y", [5], 10**7)],
     "the nodes, array part_00000/nodes/_N/y: row 5 has label 10,000,000, so a model would need 10,000,001 output"),
    ("no training node", [("part_00000/nodes/_N/train_mask", None, False), ("part_00001/nodes/_N/train_mask", None,
                                                                             False)],
     "the nodes, array train_mask: no node is in train_mask (in any of the 2 partitions)"),
    ("indptr decreases", [("part_00000/edges/_N/indptr", [5], 0)],
     "part_00000/edges/_N/indptr: chunk 0 is damaged (indptr decreases, at row 5)"),
    ("indices out of range", [("part_00001/edges/_N/indices", [3], 10**6)],
     "part_00001/edges/_N/indices: chunk 0 is damaged (a source ID is outside the source node range, at row 3)"),
]


def damage_stored(root: str, changes: list) -> int:
    """Apply a row of ``STORED_CASES``; returns ``{r}``."""
    r = first_train_row(root, 1)
    for path, rows, value in changes:
        set_stored(root, path, [r] if rows == "r" else rows, value)
    return r


@pytest.mark.parametrize("case,changes,words", STORED_CASES, ids=[c[0] for c in STORED_CASES])
def test_verify_finds_what_training_would_refuse_in_stored_arrays(damaged, capsys, case, changes, words):
    assert main(["verify", damaged]) == 0
    capsys.readouterr()
    r = damage_stored(damaged, changes)
    assert main(["verify", damaged]) == 1
    err = capsys.readouterr().err
    assert "problem(s)" in err and "chunks:" in err and "fails" not in err
    assert words.format(r=r) in err, err


def test_verify_says_what_it_checked(dataset_dir, capsys):
    assert main(["verify", dataset_dir]) == 0
    assert "labels, training nodes, features and topology hold what training needs" in capsys.readouterr().out


# CSC invariants for data whose checksums match (another writer, a hand-edited manifest): one row each
GOOD = dict(indptr=[0, 2, 3, 5], indices=[0, 4, 1, 2, 3], eid=[0, 1, 2, 3, 4])
INVARIANT_CASES = [
    ("indptr", [1, 2, 3, 5], {}, "indptr[0] is not 0"),
    ("indptr", [0, 3, 2, 5], {}, "indptr decreases, at row 2"),
    ("indptr", [0, 2, 3, 9], {}, "points past the end"),
    ("indptr", [0, 2, 3, 4], {}, "does not end at the edge count"),
    ("indices", [0, 4, 1, 2, 5], {}, "outside the source node range, at row 4"),
    ("indices", [0, -1, 1, 2, 3], {}, "outside the source node range, at row 1"),
    ("indices", [4, 0, 1, 2, 3], {}, "not sorted, at row 1"),
    ("eid", [0, 1, 2, 3, 5], {}, "edge ID is outside [0, 5), at row 4"),
    ("packed", None, {"packed_row": (3, [2, 9])}, "differs from indices/eid, at row 3"),
]


@pytest.mark.parametrize("name,values,extra,message", INVARIANT_CASES)
def test_csc_invariants(name, values, extra, message):
    arrays = {k: np.array(v, np.int64) for k, v in GOOD.items()}
    packed = np.stack([arrays["indices"], arrays["eid"]], axis=1).astype(np.int32)
    check_csc("ds/p0", arrays["indptr"], arrays["indices"], arrays["eid"], packed, 5, 5, {})  # sound as given
    if values is not None:
        arrays[name] = np.array(values, np.int64)
    if "packed_row" in extra:
        row, pair = extra["packed_row"]
        packed[row] = pair
    with pytest.raises(CorruptDatasetError) as info:
        check_csc("ds/p0", arrays["indptr"], arrays["indices"], arrays["eid"], packed, 5, 5, {name: 2})
    assert message in str(info.value), str(info.value)
    assert f"ds/p0/{name}: chunk" in str(info.value)


def test_unwritable_dest_is_one_line(inputs, tmp_path, capsys, monkeypatch):
    """A DEST in a directory that cannot be written (as root, simulated: permissions do not bind root)."""
    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda path, mode: False if str(path) == str(tmp_path) else real_access(path, mode))
    assert main(["ingest", f"npz:{inputs}/g.npz", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write in" in err and len(err.splitlines()) == 1, err
    assert os.listdir(tmp_path) == []


def test_file_system_errors_while_staging_are_one_line(inputs, tmp_path, capsys, monkeypatch):
    """A read-only or full file system found when the staging directory is made (EROFS, ENOSPC)."""
    def refuse(self):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("graphstore.storage.local.LocalLocation.staging", refuse)
    assert main(["ingest", f"npz:{inputs}/g.npz", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Read-only file system" in err and "nothing was changed" in err and len(err.splitlines()) == 1, err


# -- operating-system errors while writing: one line naming DEST and the fix, nothing left behind --

def _raise(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


OS_ERRORS = [  # (what fails, how, a word of the one-line message)
    ("graphstore.ingest.chunk_writer.ArrayWriter._set", errno.ENOSPC, "No space left on device [ENOSPC]); the disk is full"),
    ("graphstore.ingest.chunk_writer.ArrayWriter._set", errno.EROFS, "read-only"),
    ("graphstore.ingest.chunk_writer.ArrayWriter._set", errno.EACCES, "permission denied"),
    ("graphstore.ingest.chunk_writer.ArrayWriter._set", errno.EIO, "I/O error"),
    ("graphstore.ingest.scratch.Scratch.put", errno.ENOSPC, "the disk is full"),
    ("graphstore.ingest.scratch.Scratch.put", errno.EDQUOT, "quota"),
    ("graphstore.storage.local.FileSlot.create", errno.ENOSPC, "taking the ingest claim"),
    ("graphstore.storage.local.LocalLocation.replace_with", errno.EXDEV, "renaming the new dataset into place"),
]


@pytest.mark.parametrize("target,code,word", OS_ERRORS, ids=[f"{t.rsplit('.', 1)[-1]}-{errno.errorcode[c]}"
                                                            for t, c, _ in OS_ERRORS])
def test_os_errors_while_writing_are_one_line(inputs, tmp_path, capsys, monkeypatch, target, code, word):
    module, owner, name = target.rsplit(".", 2)
    fail = _raise(code)
    monkeypatch.setattr(getattr(importlib.import_module(module), owner), name,
                        staticmethod(fail) if name == "_set" else fail)
    dest = tmp_path / "o"
    assert main(["ingest", f"npz:{inputs}/g.npz", str(dest), "--parts", "2", "--method", "random"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(dest) in err and word in err, err
    assert os.listdir(tmp_path) == [], "a staging directory or the claim was left behind"


def test_an_os_error_of_a_dask_task_names_dest():
    """A worker's OSError comes back inside IngestStageError: it is named as DEST's, like the local one."""
    from graphstore.errors import IngestStageError, StorageError
    from graphstore.ingest.pipeline import _named
    from graphstore.storage.local import open_location

    location = open_location("/data/ds")
    stage = IngestStageError("ingest stage 'edges', task 3 failed on a worker: OSError: ...")
    stage.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/data/.ds.partial-1-ab/tmp/x")
    error = _named(location, stage)
    assert isinstance(error, StorageError) and "/data/ds" in str(error) and "the disk is full" in str(error)
    elsewhere = OSError(errno.EIO, "Input/output error", "/sources/g.npz")  # the SOURCE's file: not DEST's
    assert _named(location, elsewhere) is elsewhere


@pytest.fixture
def small_disk(tmp_path):
    """A 5 MB tmpfs (root only), unmounted however the test ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 5 MB tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)]).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_one_line_naming_dest(small_disk, capsys):
    dest = small_disk / "ds"  # about 8 MB of features alone
    assert main(["ingest", "synthetic:nodes=30000,avg_degree=5,features=64,classes=4,seed=1", str(dest),
                 "--method", "random"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(dest) in err and "space" in err, err
    assert os.listdir(small_disk) == [], "the staging directory or the claim was left on the full disk"


def test_a_refused_s3_endpoint_is_one_line(inputs, tmp_path, capsys, monkeypatch):
    from tests.graphstore.conftest import fake_credentials

    fake_credentials(monkeypatch, tmp_path)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["ingest", f"npz:{inputs}/g.npz", "s3://gs-bucket/ds", "--storage-option",
                 f"client_kwargs.endpoint_url=http://127.0.0.1:{port}", "--storage-option",
                 "config_kwargs.retries.total_max_attempts=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"127.0.0.1:{port}" in err and "check the endpoint" in err, err
