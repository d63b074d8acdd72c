"""Partitions read with pread, never mapped (Dataset.read_unmapped, graphstore-train --unmapped): the same
samples and rows as mapped, none of the dataset's pages in the process's resident set, and a clear error for
what the unmapped reads do not serve."""

from __future__ import annotations

import pickle

import numpy as np
import psutil
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from graphstore.errors import CorruptDatasetError, InvalidInputError, PartitionIndexError
from graphstore.storage.fileio import FileRows
from sampling import NeighborSampler
from sampling.distributed.dist_loader import DistributedNeighborLoader
from sampling.warmup.groups import ranks
from tests.conftest import small_graph


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """3 partitions in chunks of a few KB: a node's edges and a hop's reads cross chunk boundaries."""
    source, _ = small_graph(n=3000, e=60000, seed=2)
    dest = tmp_path_factory.mktemp("unmapped") / "ds"
    graphstore.ingest(source, dest, num_parts=3, chunk_mb=0.004)
    return str(dest)


def _unmapped(url: str):
    ds = graphstore.open_dataset(url)
    ds.read_unmapped(range(ds.num_parts))
    return ds


def _batches(ds, **options):
    sampler = NeighborSampler(ds, [6, 4, 3], seed=5, **options)
    seeds = [np.array([1, 5, 9, 2000, 2999]), np.arange(0, 3000, 3)]  # a small frontier and one sorted by ID
    return [sampler.sample_from_nodes(NodeSamplerInput(None, torch.from_numpy(s))) for s in seeds]


@pytest.mark.parametrize("options", [{}, {"replace": True}, {"disjoint": True}])
def test_unmapped_partitions_give_the_same_samples_as_mapped(chunked, options):
    info = graphstore.open_dataset(chunked).manifest.arrays
    assert max(a.num_chunks for p, a in info.items() if p.endswith("packed")) > 10  # reads cross chunks
    ds = _unmapped(chunked)
    assert NeighborSampler(ds, [2]).fast_path.blocks.files is not None  # the unmapped kernel runs
    for mapped, unmapped in zip(_batches(graphstore.open_dataset(chunked), **options), _batches(ds, **options)):
        for field in ("node", "row", "col", "edge", "batch"):
            a, b = getattr(mapped, field), getattr(unmapped, field)
            assert (a is None and b is None) or torch.equal(a, b), field
        assert mapped.num_sampled_edges == unmapped.num_sampled_edges
        for x, y in zip(mapped.edge_locator[None](), unmapped.edge_locator[None]()):  # CSC positions: the
            assert np.array_equal(x, y)  # staged ones translated back


def test_unmapped_reads_leave_no_dataset_page_in_the_resident_set_and_no_file_mapped(chunked):
    def dataset_rss(ds) -> dict[str, int]:
        root = str(ds.location.root)
        return {m.path: m.rss for m in psutil.Process().memory_maps(grouped=True) if m.path.startswith(root) and m.rss}

    def dataset_maps(ds) -> list[str]:  # mapped at all, resident or not: the topology too
        root = str(ds.location.root)
        return [m.path for m in psutil.Process().memory_maps(grouped=True) if m.path.startswith(root)]

    for ds in (_unmapped(chunked), graphstore.open_dataset(chunked)):
        _batches(ds)
        fs, _ = ds.partition(1)
        lo, hi = ds.manifest.node_types[0].offsets[1:3]
        rows = fs[None, "x", torch.arange(int(lo), int(hi))]
        assert rows.shape == (int(hi - lo), 8)
        with ranks(ds, 2) as (transport, layout):  # the training loader: every node attribute, remote requests
            loader = DistributedNeighborLoader(ds, [5, 3], transport, "train_mask", layout=layout, batch_size=64,
                                               prefetch=0)
            batches = [b for _, b in zip(range(3), loader)]
        assert len(batches) == 3 and batches[0].x.shape[1] == 8
        if ds.unmapped_parts:
            assert dataset_rss(ds) == {} and dataset_maps(ds) == []
        else:
            assert dataset_rss(ds)  # the checks themselves: mapped reads do show, and so do mapped files
            assert any("/packed/" in p for p in dataset_maps(ds)), dataset_maps(ds)


@pytest.mark.parametrize("direct", [True, False])
def test_the_disk_reader_over_an_unmapped_partition_counts_and_reads_as_over_a_mapped_one(chunked, direct):
    """``--unmapped --feature-cache``: the hottest rows are counted from the edges read in pieces (mapping
    nothing), and the disk reader serves the mapped rows, through O_DIRECT or (where a file system refuses
    it) through the page cache."""
    from graphstore.storage.directrows import direct_rows
    from sampling.loader.gpu_cache import edge_source_counts

    ds, mapped = _unmapped(chunked), graphstore.open_dataset(chunked)
    info = ds.manifest.node_types[0]
    want = edge_source_counts(mapped, (1, 2), info)
    assert np.array_equal(edge_source_counts(ds, (1, 2), info, piece=1000), want) and want.sum() > 0
    path = f"part_00001/nodes/{info.key}/x"
    full = np.asarray(mapped.array(path))
    hot = np.argsort(-want[int(info.offsets[1]):int(info.offsets[2])])[:50]
    reader = direct_rows(ds.chunk_files(path), ds.array(path), hot, direct=direct)
    if reader is None:  # tmpfs: no O_DIRECT here
        pytest.skip("this file system refuses O_DIRECT")
    ids = np.random.default_rng(3).integers(0, len(full), 900)
    assert np.array_equal(reader[ids], full[ids]) and np.array_equal(np.asarray(reader), full)
    snap = reader.snapshot()
    assert snap["hits"] == int(np.isin(ids, hot).sum()) > 0 and snap["disk_bytes"] > 0


def test_unmapped_feature_rows_equal_the_mapped_ones_in_any_order(chunked):
    ds, mapped = _unmapped(chunked), graphstore.open_dataset(chunked)
    info = ds.manifest.node_types[0]
    lo, hi = (int(v) for v in info.offsets[1:3])
    ids = np.random.default_rng(0).integers(lo, hi, 700)
    ids[:5] = ids[5]  # repeats
    for name in ("x", "y", "train_mask", "orig_id"):
        got, want = ds.partition(1)[0][None, name, torch.from_numpy(ids)], mapped.partition(1)[0][None, name,
                                                                                                  torch.from_numpy(ids)]
        assert torch.equal(got, want), name
    rows = ds.array(f"part_00001/nodes/{info.key}/x")
    full = np.asarray(mapped.array(f"part_00001/nodes/{info.key}/x"))
    assert isinstance(rows, FileRows)
    assert np.array_equal(rows[3], full[3]) and np.array_equal(rows[-1], full[-1])
    assert np.array_equal(rows[10:700], full[10:700]) and np.array_equal(rows[5:50:7], full[5:50:7])
    assert np.array_equal(np.asarray(rows), full)
    assert rows.snapshot(reset=True)["rows"] > 0 and rows.snapshot()["rows"] == 0
    with pytest.raises(IndexError, match="out of range"):
        rows[np.array([0, len(full)])]


def test_a_dataset_pickles_with_its_partitions_still_unmapped(chunked):
    ds = pickle.loads(pickle.dumps(_unmapped(chunked)))
    assert ds.unmapped_parts == {0, 1, 2}
    assert isinstance(ds.array(f"part_00000/nodes/{ds.manifest.node_types[0].key}/x"), FileRows)
    assert NeighborSampler(ds, [2]).fast_path.blocks.files is not None


def test_what_the_unmapped_kernel_does_not_read_is_refused_by_name(chunked):
    ds = _unmapped(chunked)
    with pytest.raises(InvalidInputError, match="weighted"):
        NeighborSampler(ds, [2], weight_attr="weight").fast_path
    with pytest.raises(InvalidInputError, match="temporal"):
        NeighborSampler(ds, [2], time_attr="time").fast_path
    with pytest.raises(InvalidInputError, match="induced"):  # every edge among the nodes: read from the arrays
        NeighborSampler(ds, [2], subgraph_type="induced").sample_from_nodes(
            NodeSamplerInput(None, torch.tensor([1, 5, 9])))
    with pytest.raises(PartitionIndexError, match=r"\[7\]"):
        graphstore.open_dataset(chunked).read_unmapped([7])


def test_a_truncated_chunk_is_named_not_read_as_garbage(tmp_path):
    source, _ = small_graph(n=300, e=2000, seed=1)
    graphstore.ingest(source, tmp_path / "ds", num_parts=1)
    ds = _unmapped(str(tmp_path / "ds"))
    rows = ds.array(f"part_00000/nodes/{ds.manifest.node_types[0].key}/x")
    with open(rows.files.paths[-1], "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CorruptDatasetError, match="graphstore verify"):
        rows[np.array([1, 299])]


def test_running_out_of_file_descriptors_says_which_limit_to_raise(chunked):
    import subprocess
    import sys

    code = ("import resource, graphstore\n"
            "from graphstore.errors import InvalidInputError\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
            f"ds = graphstore.open_dataset({chunked!r})\n"
            "ds.read_unmapped(range(ds.num_parts))\n"
            "try:\n"
            "    [ds.chunk_files(p) for p in ds.manifest.arrays if p.endswith('packed')]\n"
            "except InvalidInputError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "too many open files" in done.stdout and "ulimit -n" in done.stdout, done.stderr
