"""Damage seen everywhere: one row per kind of damage, caught by every open, by ``info`` and by ``verify``.

A row of ``DAMAGE`` is (case id, how to damage a copy of a small dataset, words the open error and the
verify line must contain). Every open (``graphstore.open_dataset``, ``graphstore info``) refuses the damaged
copy with one line ending in the fix; ``graphstore verify`` still opens it, lists the problem naming the
array or partition, and exits 1.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import graphstore
from graphstore.dataset import layout
from graphstore.cli.app import main
from graphstore.errors import CorruptDatasetError
from graphstore.storage.integrity import manifest_problems
from tests.conftest import small_graph

X1 = "part_00001/nodes/_N/x"  # 298 rows of 8 float32, 2 chunks
INDICES0 = "part_00000/edges/_N/indices"


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    source, _ = small_graph()
    dest = tmp_path_factory.mktemp("damage") / "ds"
    graphstore.ingest(source, dest, num_parts=2, halo_features="x", chunk_mb=0.01)
    return dest


@pytest.fixture
def damaged(dataset_dir, tmp_path) -> Path:
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    return copy


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: len(file.read_bytes()) // 2])


def _edit_json(file: Path, edit) -> None:
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))


def _edit_manifest(root: Path, edit) -> None:
    _edit_json(root / layout.ROOT_METADATA, lambda doc: edit(doc["attributes"][layout.MANIFEST_ATTR]))


def _set_chunk_rows(doc: dict) -> None:
    doc["chunk_grid"]["configuration"]["chunk_shape"][0] += 1


DAMAGE = [
    ("truncated array zarr.json", lambda d: _truncate(d / X1 / "zarr.json"), [X1, "does not parse"]),
    ("truncated topology zarr.json", lambda d: _truncate(d / INDICES0 / "zarr.json"), [INDICES0, "does not parse"]),
    ("empty array zarr.json", lambda d: (d / X1 / "zarr.json").write_bytes(b""), [X1, "does not parse"]),
    ("array zarr.json is a group", lambda d: _edit_json(d / X1 / "zarr.json", lambda m: m.update(node_type="group")),
     [X1, "does not parse"]),
    ("wrong shape", lambda d: _edit_json(d / X1 / "zarr.json", lambda m: m.update(shape=[300, 8])),
     [X1, "shape [300, 8] (the manifest says [298, 8])"]),
    ("wrong row shape", lambda d: _edit_json(d / X1 / "zarr.json", lambda m: m.update(shape=[298, 4])),
     [X1, "shape [298, 4]"]),
    ("wrong dtype", lambda d: _edit_json(d / X1 / "zarr.json", lambda m: m.update(data_type="float64")),
     [X1, "dtype float64 (the manifest says float32)"]),
    ("wrong chunking", lambda d: _edit_json(d / X1 / "zarr.json", _set_chunk_rows), [X1, "chunks [257, 8]"]),
    ("no shape in zarr.json", lambda d: _edit_json(d / X1 / "zarr.json", lambda m: m.pop("shape")),
     [X1, "lacks shape"]),
    ("deleted array zarr.json", lambda d: os.remove(d / X1 / "zarr.json"), [X1, "metadata", "is missing"]),
    ("deleted partition directory", lambda d: shutil.rmtree(d / "part_00001"),
     ["part_00001: the partition is missing"]),
    ("deleted array directory", lambda d: shutil.rmtree(d / X1), [X1, "the array is missing"]),
    ("deleted group directory", lambda d: shutil.rmtree(d / "part_00000" / "halo"),
     ["part_00000/halo: the group is missing"]),
    ("deleted group zarr.json", lambda d: os.remove(d / "part_00001" / "nodes" / "zarr.json"),
     ["part_00001/nodes: its group metadata", "is missing"]),
    ("deleted chunk file", lambda d: os.remove(d / X1 / "c" / "1" / "0"), [X1, "chunk 1", "missing"]),
    ("truncated chunk file", lambda d: _truncate(d / X1 / "c" / "0" / "0"), [X1, "chunk 0"]),
    ("manifest lists a shape the array lacks",
     lambda d: _edit_manifest(d, lambda m: m["arrays"][X1].update(shape=[297, 8])), [X1, "[297, 8]"]),
    ("manifest lacks an attribute's array", lambda d: _edit_manifest(d, lambda m: m["arrays"].pop(X1)),
     [X1, "no entry"]),
    ("manifest offsets do not add up", lambda d: _edit_manifest(d, lambda m: m["node_types"][0].update(num_nodes=601)),
     ["offsets", "601 nodes"]),
]
IDS = [case[0] for case in DAMAGE]


@pytest.mark.parametrize("case,damage,words", DAMAGE, ids=IDS)
def test_every_open_refuses_damage(damaged, case, damage, words):
    damage(damaged)
    with pytest.raises(CorruptDatasetError) as info:
        graphstore.open_dataset(damaged)
    message = str(info.value)
    assert all(w in message for w in words), message
    assert len(message.splitlines()) == 1 and message.endswith("then re-ingest with --overwrite"), message
    assert f"run `graphstore verify {damaged}`" in message


@pytest.mark.parametrize("case,damage,words", DAMAGE, ids=IDS)
def test_info_refuses_damage_in_one_line(damaged, capsys, case, damage, words):
    damage(damaged)
    assert main(["info", str(damaged)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words) and "graphstore verify" in err, err


@pytest.mark.parametrize("case,damage,words", DAMAGE, ids=IDS)
def test_verify_lists_damage_and_exits_1(damaged, capsys, case, damage, words):
    damage(damaged)
    assert main(["verify", str(damaged)]) == 1
    err = capsys.readouterr().err
    assert "problem(s) in" in err and "--overwrite" in err, err
    assert any(all(w in line for w in words) for line in err.splitlines()), err
    assert main(["verify", str(damaged), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and any(all(w in p for w in words) for p in report["problems"])


def test_verify_lists_every_problem_once(damaged, capsys):
    """Several kinds of damage at once: each is one line; a missing partition is one line, not one per chunk."""
    shutil.rmtree(damaged / "part_00001")
    _truncate(damaged / INDICES0 / "zarr.json")
    os.remove(damaged / "part_00000" / "nodes" / "_N" / "y" / "c" / "0")
    problems = graphstore.open_dataset(damaged, check=False).verify()
    assert len(problems) == 3, problems
    assert problems[0].startswith(INDICES0) and problems[1].startswith("part_00001: the partition is missing")
    assert problems[2].startswith("part_00000/nodes/_N/y: chunk 0")  # metadata first, then chunks


def test_a_sound_dataset_opens_and_verifies(dataset_dir, capsys):
    ds = graphstore.open_dataset(dataset_dir)
    assert manifest_problems(ds.manifest) == [] and ds.verify() == []
    assert main(["verify", str(dataset_dir)]) == 0
    assert "all 26 arrays matches the manifest, and all" in capsys.readouterr().out


def test_remote_open_reads_only_the_manifest_and_verify_finds_metadata_damage(s3, dataset_dir, tmp_path, capsys):
    """Object storage: an open sends one request (the manifest), so metadata damage waits for verify."""
    url, fs = s3.url("ds"), s3.fs()
    fs.put(str(dataset_dir), f"{s3.bucket}/ds", recursive=True)
    key = f"{s3.bucket}/ds/{X1}/zarr.json"
    fs.pipe_file(key, fs.cat_file(key)[:40])
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=tmp_path / "cache")
    assert ds.io_stats()["requests"] == 1
    assert main(["verify", url, *s3.cli_options(), "--cache-dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert f"{X1}: its metadata {X1}/zarr.json does not parse" in err, err
    fs.rm(f"{s3.bucket}/ds/part_00001", recursive=True)
    problems = graphstore.open_dataset(url, s3.storage_options, cache_dir=tmp_path / "cache").verify()
    assert problems == [p for p in problems if p.startswith("part_00001: the partition is missing")] and problems
