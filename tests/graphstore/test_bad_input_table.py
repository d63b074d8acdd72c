"""Bad input and damaged data, one row each: exit code, a word of the one-line message, nothing touched.

A row of ``CLI_CASES`` is (arguments, expected exit code, a word the error must contain). ``{d}`` is a
directory of input files shared by every row (its bytes must be unchanged afterwards), ``{t}`` the
row's own empty directory (it must still be empty afterwards: nothing written, nothing left behind).
"""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest

import graphstore
from graphstore.cli import main
from graphstore.errors import CorruptDatasetError, DatasetExistsError
from graphstore.integrity import check_csc
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
    (["info", "{t}/missing"], 2, "no graphstore dataset"),
    (["verify", "{d}/npy"], 2, "no graphstore dataset"),
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
    (d / "notes.txt").write_text("precious")
    (d / "npy").mkdir()
    np.save(d / "npy" / "edge_index.npy", EI)
    _fake_ogb(d / "ogb", schemes=("time", "random"))
    for name, file, lines in _ogb_variants():
        _write_csv_gz(_fake_ogb(d / name) / "raw" / file, lines)
    return str(d)


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
    assert word in err, err
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    assert _digest(inputs) == before, "an input file was changed, moved or removed"
    assert sorted(os.listdir(inputs)) == sorted(before_names(before)), "something was left beside the inputs"
    assert os.listdir(tmp_path) == [], "something was written"


def before_names(digest: dict[str, str]) -> set[str]:
    return {path.split(os.sep)[0] for path in digest}


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

    monkeypatch.setattr("graphstore.storage.LocalLocation.staging", refuse)
    assert main(["ingest", f"npz:{inputs}/g.npz", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Read-only file system" in err and "nothing was changed" in err and len(err.splitlines()) == 1, err
