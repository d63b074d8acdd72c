"""The PyG FeatureStore / GraphStore contract of a partition, pickling, and DataLoader workers."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from torch_geometric.data import FeatureStore, GraphStore

import graphstore
from graphstore.errors import NotOwnedError, UnknownAttributeError
from graphstore.dataset.stores import ReadOnlyError
from tests.conftest import small_graph, small_hetero


@pytest.fixture(scope="module")
def homo(tmp_path_factory):
    source, expected = small_graph(n=800, e=6000, seed=2)
    dest = tmp_path_factory.mktemp("homo") / "ds"
    graphstore.ingest(source, dest, num_parts=2, chunk_mb=0.01)
    return graphstore.open_dataset(dest), expected


def _order(ds, ntype=None):
    return np.concatenate([ds.partition(p)[0][ntype, "orig_id", None].numpy() for p in range(ds.num_parts)])


def test_stores_are_pyg_interfaces(homo):
    ds, _ = homo
    fs, gs = ds.partition(1)
    assert isinstance(fs, FeatureStore) and isinstance(gs, GraphStore)
    names = {(a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()}
    assert names == {(None, "x"), (None, "y"), (None, "train_mask"), (None, "time"), (None, "orig_id")}
    lo, hi = gs.dst_range()
    assert fs.get_tensor_size(None, "x") == (hi - lo, 8)
    (attr,) = gs.get_all_edge_attrs()
    assert attr.layout.value == "csc" and attr.size == (800, hi - lo)


def test_gather_by_global_ids(homo):
    ds, expected = homo
    order, x = _order(ds), expected.node_attrs[None]["x"]
    fs, gs = ds.partition(1)
    lo, hi = gs.dst_range()
    ids = torch.from_numpy(np.random.default_rng(0).integers(lo, hi, 500))
    out = fs[None, "x", ids]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert np.array_equal(out.numpy(), x[order[ids.numpy()]])
    assert np.array_equal(fs[None, "x", slice(lo, lo + 7)].numpy(), x[order[lo: lo + 7]])
    assert np.array_equal(fs[None, "y", torch.tensor([hi - 1, lo])].numpy(), expected.node_attrs[None]["y"][order[[hi - 1, lo]]])
    assert fs[None, "x", torch.zeros(0, dtype=torch.long)].shape == (0, 8)
    # PyG's keyword API and multi_get_tensor answer the same
    assert torch.equal(fs.get_tensor(group_name=None, attr_name="x", index=ids), out)
    from torch_geometric.data import TensorAttr
    both = fs.multi_get_tensor([TensorAttr(None, "x", ids), TensorAttr(None, "y", ids)])
    assert torch.equal(both[0], out) and both[1].dtype == torch.int64


def test_a_large_mapped_array_gathers_through_the_cold_start_reads(homo, monkeypatch):
    from graphstore.storage import diskrows

    monkeypatch.setattr(diskrows, "COLD_MIN_BYTES", 0)  # every mapped array counts as large
    ds, expected = graphstore.open_dataset(homo[0].url), homo[1]
    order, x = _order(ds), expected.node_attrs[None]["x"]
    fs, gs = ds.partition(1)
    lo, hi = gs.dst_range()
    for _ in range(diskrows.WARM_AFTER + 1):  # asking ahead, then (the rows cached) not
        ids = torch.from_numpy(np.random.default_rng(0).integers(lo, hi, 500))
        assert np.array_equal(fs[None, "x", ids].numpy(), x[order[ids.numpy()]])
    assert fs._readers[(None, "x")].cold is not None
    with pytest.raises(NotOwnedError, match="owned by partition"):
        fs[None, "x", torch.tensor([lo, 0])]  # a row partition 0 owns: refused, naming it, as without


def test_foreign_ids_name_the_owner(homo):
    ds, _ = homo
    fs, _ = ds.partition(0)
    lo1 = int(ds.node_offsets()[1])
    with pytest.raises(NotOwnedError, match=r"owned by partition\(s\) \[1\]"):
        fs[None, "x", torch.tensor([0, lo1])]
    with pytest.raises(NotOwnedError, match=r"outside \[0, 800\)"):
        fs[None, "x", torch.tensor([900])]
    with pytest.raises(KeyError):  # NotOwnedError is a KeyError, as PyG callers expect
        fs[None, "x", torch.tensor([lo1])]
    with pytest.raises(UnknownAttributeError, match="no attribute 'z'"):
        fs[None, "z", None]


def test_stores_are_read_only_and_writes_never_reach_disk(homo):
    ds, _ = homo
    fs, gs = ds.partition(0)
    with pytest.raises(ReadOnlyError):
        fs[None, "x", None] = torch.zeros(3)
    with pytest.raises(ReadOnlyError):
        gs.put_edge_index((torch.zeros(1), torch.zeros(2)), None, "csc")
    x = fs[None, "x", None]
    x += 1  # a private copy-on-write page: no crash, the file is unchanged
    fresh = graphstore.open_dataset(ds.url).partition(0)[0][None, "x", None]
    assert not torch.equal(x, fresh)
    assert ds.verify() == []


def test_stores_pickle_without_mapped_arrays(homo):
    ds, _ = homo
    fs, gs = ds.partition(1)
    fs[None, "x", None]
    blob = pickle.dumps((fs, gs))
    assert len(blob) < 100_000  # the manifest, not the arrays
    fs2, gs2 = pickle.loads(blob)
    assert torch.equal(fs2[None, "x", None], fs[None, "x", None])
    assert all(torch.equal(a, b) for a, b in zip(gs2.get_edge_index(None, "csc"), gs.get_edge_index(None, "csc")))


class _Rows(torch.utils.data.Dataset):
    def __init__(self, fs, lo, hi):
        self.fs, self.lo, self.hi = fs, lo, hi

    def __len__(self):
        return self.hi - self.lo

    def __getitem__(self, i):
        return self.fs[None, "x", torch.tensor([self.lo + i])][0]


@pytest.mark.slow
def test_dataloader_workers_read_the_store(homo):
    ds, expected = homo
    fs, gs = ds.partition(1)
    lo, hi = gs.dst_range()
    loader = torch.utils.data.DataLoader(_Rows(fs, lo, hi), batch_size=64, num_workers=2,
                                         multiprocessing_context="spawn")
    got = torch.cat(list(loader)).numpy()
    assert np.array_equal(got, expected.node_attrs[None]["x"][_order(ds)[lo:hi]])


def test_hetero_stores(tmp_path):
    data, _ = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=2)
    ds = graphstore.open_dataset(tmp_path / "h")
    fs, gs = ds.partition(0)
    groups = {a.group_name for a in fs.get_all_tensor_attrs()}
    assert groups == {"paper", "author"}
    sizes = {a.edge_type: a.size for a in gs.get_all_edge_attrs()}
    lo, hi = ds.node_offsets("paper")[:2]
    assert sizes[("author", "writes", "paper")] == (120, hi - lo)
    assert gs.get_edge_index(("paper", "cites", "paper"), "csc")[1].shape == (hi - lo + 1,)
    assert gs.edge_attr("edge_attr", ("paper", "cites", "paper")).shape[1] == 2
    with pytest.raises(UnknownAttributeError, match="edge type"):
        gs.get_edge_index(("paper", "nope", "paper"), "csc")


@pytest.mark.parametrize("parts", [3, 5])
def test_dataset_store_gathers_across_partitions(tmp_path, parts):
    """The one-pass gather over every partition (rows of any width and dtype, IDs in any order,
    repeated, from one or many partitions) returns exactly the input rows."""
    from graphstore.dataset.whole import DatasetFeatureStore

    source, expected = small_graph(n=900, e=5000, seed=4, features=3)  # 12-byte rows: 32-bit words
    graphstore.ingest(source, tmp_path / "ds", num_parts=parts, chunk_mb=0.01)
    ds = graphstore.open_dataset(tmp_path / "ds")
    fs, order = DatasetFeatureStore(ds), _order(ds)
    rng = np.random.default_rng(0)
    for ids in (rng.integers(0, 900, 700), np.array([899, 0, 0, 450]), np.arange(5), np.zeros(0, np.int64)):
        for name, values in expected.node_attrs[None].items():
            got = fs[None, name, torch.from_numpy(ids)].numpy()
            assert np.array_equal(got, values[order[ids]]), name
        assert np.array_equal(fs[None, "orig_id", torch.from_numpy(ids)].numpy(), order[ids])
    assert fs._word_views(ds.manifest.node_types[0], "x")[0].dtype == np.uint32


def _resident_kb(folder: str) -> int:
    """Resident KiB of this process's mappings of files under ``folder`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) > 5 and head[5].startswith(folder)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps (Linux)")
def test_the_topology_check_leaves_no_pages_in_the_resident_set(tmp_path):
    """Opening topology checks every CSC array (a full read) through mappings of its own, so a sampler that
    reads only the packed pairs does not hold indices and eid in its resident set (they were 1.8 of a
    rank's 3.3 GB of mapped pages at 12M nodes, measured)."""
    from sampling.graph.topology import from_dataset

    source, _ = small_graph(n=4000, e=120_000, seed=3)
    graphstore.ingest(source, tmp_path / "ds", num_parts=1)
    ds = graphstore.open_dataset(tmp_path / "ds")
    indptr, indices, eid, packed = ds.topology(0)
    assert packed is not None and indices.nbytes > 512 << 10
    edges = str(tmp_path / "ds" / "part_00000" / "edges")
    assert _resident_kb(edges) == 0  # checked, nothing left mapped
    from_dataset(ds, [0], None, None)  # the sampler's blocks: prefaults what it reads
    assert _resident_kb(edges + "/_N/packed") * 1024 >= packed.nbytes - 4096
    assert _resident_kb(edges + "/_N/indices") == _resident_kb(edges + "/_N/eid") == 0
    assert int(np.asarray(indices)[-1]) == int(packed.reshape(-1)[-2])  # the served arrays still read
