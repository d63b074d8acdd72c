"""How the sampler's kernels meet memory: the picks kernels count no references (numba ``_nrt=False``),
and the arrays they read at random are mapped with 2 MiB pages where the kernel can (``MADV_HUGEPAGE``
before the first read: topology and derived arrays; never features)."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

import graphstore
import graphstore.storage.arrays as arrays
import graphstore.storage.mapped as mapped
from graphstore.storage.integrity import mapped_checksum
from graphstore.storage.local import LocalLocation
from sampling import NeighborSampler
from sampling.graph import derived
from sampling.kernels import picks
from sampling.kernels.structs import Edges, Frontier, Hop


def _sample(sampler, seeds, time=None):
    seeds = torch.as_tensor(seeds)
    when = None if time is None else torch.full((len(seeds),), time, dtype=torch.int64)
    return sampler.sample_from_nodes(NodeSamplerInput(None, seeds, when))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """100k nodes, 1M random edges with weights and times, 8 features: an 8 MB packed array."""
    rng = np.random.default_rng(0)
    nodes, edges = 100_000, 1_000_000
    data = Data(edge_index=torch.from_numpy(rng.integers(0, nodes, (2, edges))), num_nodes=nodes,
                weight=torch.from_numpy(1.0 - rng.random(edges)), time=torch.from_numpy(rng.integers(0, 1000, edges)),
                x=torch.randn(nodes, 8))
    dest = tmp_path_factory.mktemp("kmem") / "ds"
    graphstore.ingest(data, dest, num_parts=1, to_undirected=False)
    return dest


def test_the_picks_kernels_are_compiled_without_reference_counting():
    """Reference counting made numba incref and decref each array an inlined draw is passed, once per frontier
    node: atomic operations, 7% of the plain path's time and 20% of the weighted one's (perf). The kernels
    numba inlines the draws into are compiled without it; what they call inherits that."""
    assert picks.pick_block.targetoptions.get("inline") == "always"  # its body is _picks_of's call
    for kernel in (picks._picks_of, picks.pick_uniform, picks._pick_blocked, picks._pick_sorted, picks._pick_masked,
                   picks._pick_prefix):
        assert kernel.targetoptions.get("_nrt") is False, kernel.py_func.__name__
        assert kernel.targetoptions.get("nogil") is True, kernel.py_func.__name__  # loader threads sample in parallel


def test_an_allocation_without_reference_counting_fails_to_compile_rather_than_leak():
    """What makes ``_nrt=False`` safe for the picks kernels: an array allocated there (or in what they call)
    would have no owner; numba refuses to compile it."""
    from numba import njit
    from numba.core.errors import TypingError

    def allocates(n):
        return np.empty(n, np.int64).sum()

    with pytest.raises(TypingError):
        njit(nogil=True, _nrt=False)(allocates)(3)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((set(line.split(":", 1)[1].split()) for line in fh if line.startswith("flags")), set())
    except OSError:
        return set()


@pytest.mark.skipif("avx512f" not in _cpu_flags(), reason="vector scatters exist only with AVX-512 (x86 Linux)")
def test_the_picks_write_each_nodes_picks_with_contiguous_stores():
    """numba wraps an index that may be negative (``out[e + j]``) per element, so LLVM vectorised the loops
    that write a node's picks (and Floyd's compares over them) as scatters and gathers; indexed from 0 over
    a slice, they are plain vector stores and loads (docs/sampling.md, How the kernels work). Compiled afresh here
    for the plain and the temporal picks, with and without replacement."""
    from numba import njit

    rng = np.random.default_rng(0)
    n = 40
    degs = rng.integers(0, 40, n).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(degs)[:-1]]).astype(np.int64)
    total = int(degs.sum())
    order = np.arange(n, dtype=np.int64)
    state = np.array([1, 2, 3, 4], np.uint64)
    pos, col, row, eid = (np.zeros(n * 40, np.int64) for _ in range(4))
    scratch = np.zeros(64, np.int64)
    packed = rng.integers(0, 1000, 2 * total).astype(np.int32)
    records = rng.integers(0, 1000, 3 * total).astype(np.int32)
    limits = np.full(n, 500, np.int64)
    options = {key: value for key, value in picks.pick_uniform.targetoptions.items() if key != "nopython"}
    options["cache"] = False
    uniform = njit(**options)(picks.pick_uniform.py_func)
    blocked = njit(**options)(picks._pick_blocked.py_func)
    fr, out = Frontier(order, np.array([0, n], np.int64), order, starts, degs), Edges(row, col, eid, pos)
    for replace in (False, True):
        uniform(state, fr, 0, n, 15, replace, 0, out, 0, scratch, packed)
        hop = Hop(order, 0, n, 15, replace, False, limits)
        for pairs in (packed, packed[:0]):  # the CSC pairs where every edge is eligible, and without them
            blocked(state, records, fr, 0, n, hop, False, np.int64(0), np.int64(1000), out, 0, scratch, pairs)
    for kernel in (uniform, blocked):
        for signature in kernel.signatures:
            asm = kernel.inspect_asm(signature)
            assert not re.search(r"\bv(p)?scatter", asm), f"{kernel.py_func.__name__} writes its picks with scatters"
            assert not re.search(r"\bv(p)?gather", asm), f"{kernel.py_func.__name__} reads with gathers"


def test_topology_and_derived_arrays_are_advised_for_huge_pages_and_features_are_not(dataset, tmp_path,
                                                                                      monkeypatch):
    huge: dict[str, bool] = {}  # array path -> mapped with the advice
    real_map_chunks = arrays.map_chunks

    def spy(paths, shape, dtype, chunk_rows, where, huge_pages=False):
        huge[where.rsplit("/_N/", 1)[-1]] = huge.get(where.rsplit("/_N/", 1)[-1], False) or huge_pages
        return real_map_chunks(paths, shape, dtype, chunk_rows, where, huge_pages)

    monkeypatch.setattr(arrays, "map_chunks", spy)
    stored: list[np.ndarray] = []
    monkeypatch.setattr(derived, "advise_huge_pages", stored.append)
    monkeypatch.setattr(derived, "STORE_MIN_BYTES", 0)  # the time records are stored: a derived array
    ds = graphstore.open_dataset(dataset, cache_dir=tmp_path)
    _, gs = ds.partition(0)
    gs.csc_arrays(None), gs.packed_csc(None), gs.edge_attr("weight", None), ds.array("part_00000/nodes/_N/x")
    assert huge == {"indptr": True, "indices": True, "eid": True, "packed": True, "weight": False, "x": False}, huge
    _sample(NeighborSampler(ds, [5, 3], seed=0, time_attr="time"), np.arange(64), 500)
    assert stored, "the stored time records were not advised"


def test_the_mapped_checksum_is_the_checksum(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    location = LocalLocation(str(tmp_path))
    for name in ("a", "empty"):
        assert mapped_checksum(str(tmp_path / name)) == location.checksum(name)


def _pmd_mapped_kb(fragment: str) -> int:
    total, current = 0, ""
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = line.rstrip("\n")
            elif line.startswith("FilePmdMapped:") and fragment in current:
                total += int(line.split()[1])
    return total


def _evict(root) -> None:
    os.sync()
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _file_huge_pages_work(tmp_path) -> bool:
    """Whether this kernel and file system map file pages 2 MiB at a time at all (advised, cold cache)."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"\1" * (8 << 20))
    _evict(tmp_path)
    array = np.memmap(probe, dtype=np.uint8, mode="c")
    mapped.advise_huge_pages(array)
    int(array[:: 4096].sum())
    works = _pmd_mapped_kb(str(probe)) > 0
    del array
    return works


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_HUGEPAGE and smaps are Linux's")
def test_a_cold_dataset_samples_over_2mib_pages(dataset, tmp_path):
    """Opened with a cold page cache, the first read of the topology (the checksum at open) leaves it in
    2 MiB folios and the sampler's mapping of the packed pairs uses them. Before, that read went through
    read(2), which fills the cache with small folios, and every random node read missed the TLB."""
    if not _file_huge_pages_work(tmp_path):
        pytest.skip("this kernel or file system maps no file page 2 MiB at a time, even advised")
    _evict(dataset)
    ds = graphstore.open_dataset(dataset, cache_dir=tmp_path / "cache")
    _sample(NeighborSampler(ds, [5, 3], seed=0), np.arange(256))
    assert _pmd_mapped_kb("/edges/_N/packed/") > 0
