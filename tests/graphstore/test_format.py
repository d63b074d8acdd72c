"""The code against FORMAT.md: manifest fields, array paths, chunking, and plain-Zarr readability."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

import graphstore
from graphstore.dataset import layout
from graphstore.ingest.chunk_writer import chunk_rows_for
from tests.conftest import small_graph, small_hetero

FORMAT_MD = Path(__file__).resolve().parents[2] / "FORMAT.md"


def _documented_paths() -> list[re.Pattern]:
    rows = re.findall(r"^\| `(part_p/[^`]+)` \|", FORMAT_MD.read_text(), flags=re.M)
    pats = []
    for row in rows:
        pat = re.escape(row).replace("part_p", r"part_\d{5}").replace("/N/", "/[^/]+/").replace("/E/", "/[^/]+/")
        pats.append(re.compile(pat.replace(re.escape("<attr>"), "[^/]+") + "$"))
    return pats


def _documented_fields() -> set[str]:
    table = FORMAT_MD.read_text().split("## Manifest fields")[1].split("##")[0]
    return {f for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M) for f in re.findall(r"`(\w+)(?:\[\])?`", cell)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    source, _ = small_graph()
    dest = tmp_path_factory.mktemp("fmt") / "ds"
    graphstore.ingest(source, dest, num_parts=2, halo_features="x", chunk_mb=0.01)
    return dest


def test_every_array_path_is_documented(dataset):
    patterns = _documented_paths()
    assert len(patterns) == 9
    manifest = graphstore.open_dataset(dataset).manifest
    for path in manifest.arrays:
        assert any(p.match(path) for p in patterns), f"{path} is not in FORMAT.md"


def test_manifest_fields_are_documented_and_present(dataset):
    doc = json.loads((dataset / "zarr.json").read_text())
    assert doc["zarr_format"] == 3 and doc["node_type"] == "group"
    manifest = doc["attributes"][layout.MANIFEST_ATTR]
    documented = _documented_fields()
    assert set(manifest) <= documented, set(manifest) - documented
    assert {"format", "format_version", "num_parts", "node_types", "edge_types", "arrays"} <= set(manifest)
    for info in manifest["arrays"].values():
        assert all(re.fullmatch(r"crc32:[0-9a-f]{8}", c) for c in info["checksums"])


def test_plain_zarr_reads_the_same_values(dataset):
    ds = graphstore.open_dataset(dataset)
    group = zarr.open_group(str(dataset), mode="r")
    for path, info in ds.manifest.arrays.items():
        arr = group[path]
        assert arr.shape == info.shape and arr.chunks[0] == info.chunk_rows
        assert np.array_equal(np.asarray(arr[...]), np.asarray(ds.array(path))), path
        codecs = json.loads((dataset / path / "zarr.json").read_text())["codecs"]
        assert [c["name"] for c in codecs] == ["bytes"]


def test_range_partition_book_and_orig_id(dataset):
    ds = graphstore.open_dataset(dataset)
    offsets = ds.node_offsets()
    assert offsets[0] == 0 and offsets[-1] == 600 and (np.diff(offsets) > 0).all()
    ids = np.arange(600)
    owners = ds.owner(ids)
    for p in range(2):
        assert (owners[offsets[p]: offsets[p + 1]] == p).all()
        orig = np.asarray(ds.array(layout.node_array(p, "_N", "orig_id")))
        assert (np.diff(orig) > 0).all(), "inside a partition nodes keep their input order"


def test_csc_indices_sorted_within_each_destination(dataset):
    ds = graphstore.open_dataset(dataset)
    _, gs = ds.partition(1)
    indptr, indices, _ = gs.csc_arrays()
    for d in range(len(indptr) - 1):
        seg = indices[indptr[d]: indptr[d + 1]]
        assert (np.diff(seg) >= 0).all()


@pytest.mark.parametrize("rows,row_shape,dtype", [(10**7, (), np.int64), (10**6, (1433,), np.float32),
                                                  (10**6, (3,), np.float16), (777, (5,), np.float64)])
def test_chunks_are_page_multiples_or_single(rows, row_shape, dtype):
    cr = chunk_rows_for(rows, row_shape, np.dtype(dtype), 1 << 20)
    row_bytes = np.dtype(dtype).itemsize * int(np.prod(row_shape))
    assert cr == rows or (cr * row_bytes) % 4096 == 0


def test_hetero_keys_are_path_safe(tmp_path):
    data, _ = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "h")
    keys = [t.key for t in ds.manifest.edge_types]
    assert "paper__cites__paper" in keys and all("/" not in k for k in keys)
    assert ds.manifest.edge_type(("cites",)).name == ("paper", "cites", "paper")


def test_packed_pairs_repeat_indices_and_eid(dataset):
    ds = graphstore.open_dataset(dataset)
    for part in range(ds.num_parts):
        _, gs = ds.partition(part)
        _, indices, eid = gs.csc_arrays()
        packed = gs.packed_csc()
        assert packed is not None and packed.dtype == np.int32
        np.testing.assert_array_equal(packed.reshape(-1, 2), np.stack([indices, eid], axis=1))
