"""Link splits at ingest: pairs share a split, fractions and time quantiles hold, bad input refused early."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import graphstore
from graphstore.errors import InvalidInputError
from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.dataset.linksplit import LinkSplit, assign


def undirected(n: int = 500, pairs: int = 4000, seed: int = 0, dup: int = 200) -> GraphSource:
    """Random pairs stored in both directions (the reverse with another time), plus some duplicates."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
    t = rng.integers(0, 10_000, pairs)
    extra = rng.integers(0, pairs, dup)  # repeated edges
    src = np.concatenate([a, b, a[extra]])
    dst = np.concatenate([b, a, b[extra]])
    time = np.concatenate([t, t + rng.integers(0, 50, pairs), t[extra] + 7])
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return GraphSource({None: NodeTable(n, {"x": ArrayRows(x)})},
                       {None: EdgeTable(src, dst, {"time": ArrayRows(time)})}, name="undirected")


def _pair_split(src, dst, split) -> dict:
    seen: dict = {}
    for s, d, v in zip(src.tolist(), dst.tolist(), split.tolist()):
        seen.setdefault((min(s, d), max(s, d)), set()).add(v)
    return seen


@pytest.mark.parametrize("by", ["random", "time"])
def test_both_directions_and_duplicates_share_a_split(by):
    g = undirected()
    t = g.edges[None]
    split, _ = assign(t.src, t.dst, t.attrs["time"].take(np.arange(t.num_edges)), LinkSplit(by=by, seed=3), True)
    groups = _pair_split(t.src, t.dst, split)
    assert all(len(v) == 1 for v in groups.values())
    assert {next(iter(v)) for v in groups.values()} == {0, 1, 2}


def test_random_split_respects_fractions_and_the_seed():
    g = undirected(n=3000, pairs=40_000, dup=0)
    t = g.edges[None]
    split, _ = assign(t.src, t.dst, None, LinkSplit((0.7, 0.2, 0.1), seed=1), True)
    fractions = np.bincount(split, minlength=3) / len(split)
    assert np.allclose(fractions, [0.7, 0.2, 0.1], atol=0.01), fractions
    again, _ = assign(t.src, t.dst, None, LinkSplit((0.7, 0.2, 0.1), seed=1), True)
    other, _ = assign(t.src, t.dst, None, LinkSplit((0.7, 0.2, 0.1), seed=2), True)
    assert (again == split).all() and (other != split).mean() > 0.3


def test_time_split_cuts_at_global_quantiles_of_the_pair_time():
    g = undirected(n=2000, pairs=20_000)
    t = g.edges[None]
    time = t.attrs["time"].take(np.arange(t.num_edges))
    split, decided = assign(t.src, t.dst, time, LinkSplit((0.8, 0.1, 0.1), by="time"), True)
    cut1, cut2 = decided["cuts"]
    assert cut1 == np.quantile(time, 0.8, method="lower") and cut2 == np.quantile(time, 0.9, method="lower")
    pair_time: dict = {}
    for s, d, tt in zip(t.src.tolist(), t.dst.tolist(), time.tolist()):  # oracle: the pair's earliest time
        key = (min(s, d), max(s, d))
        pair_time[key] = min(pair_time.get(key, tt), tt)
    own = np.array([pair_time[(min(s, d), max(s, d))] for s, d in zip(t.src.tolist(), t.dst.tolist())])
    assert (own[split == 0] <= cut1).all() and ((own[split == 1] > cut1) & (own[split == 1] <= cut2)).all()
    assert (own[split == 2] > cut2).all()
    fractions = np.bincount(split, minlength=3) / len(split)
    assert np.allclose(fractions, [0.8, 0.1, 0.1], atol=0.03), fractions


def test_ingest_stores_the_split_aligned_with_the_csc(tmp_path):
    g = undirected()
    src, dst = g.edges[None].src.copy(), g.edges[None].dst.copy()
    graphstore.ingest(g, tmp_path / "ds", num_parts=3, link_split=(0.8, 0.1, 0.1), seed=5)
    ds = graphstore.open_dataset(tmp_path / "ds")
    record = ds.manifest.link_split(None)
    stored = np.full(len(src), -1)
    for p in range(3):
        gs = ds.partition(p)[1]
        stored[gs.csc_arrays(None)[2]] = gs.edge_attr("link_split", None).numpy()
    assert (stored >= 0).all()
    assert {k: record[k] for k in ("train", "val", "test")} == dict(zip(("train", "val", "test"),
                                                                          np.bincount(stored, minlength=3).tolist()))
    assert record["by"] == "random" and record["seed"] == 5 and record["fractions"] == [0.8, 0.1, 0.1]
    assert all(len(v) == 1 for v in _pair_split(src, dst, stored).values())
    # the trainer's fallback (same rule, computed from the dataset) gives the stored split exactly
    from sampling.graph.edgemask import computed_split

    computed = computed_split(ds, None, LinkSplit(seed=5))
    assert all((c == ds.partition(p)[1].edge_attr("link_split", None).numpy()).all() for p, c in enumerate(computed))


@pytest.mark.parametrize("kwargs, message", [
    (dict(link_split=(0.8, 0.3, 0.1)), "summing to 1"),
    (dict(link_split=(1.2, -0.1, -0.1)), "non-negative"),
    (dict(link_split="0.8,0.2"), "three non-negative fractions"),
    (dict(link_split=(0.8, 0.1, 0.1), link_split_by="year"), "use one of"),
    (dict(link_split=(0.8, 0.1, 0.1), link_split_by="time", link_split_time_attr="when"),
     "needs the edge attribute 'when'"),
    (dict(link_split_by="time"), "given without link_split"),
    (dict(link_split=(0.8, 0.1, 0.1), link_split_time_attr="time"), "needs link_split_by='time'"),
    (dict(link_split=LinkSplit(), link_split_by="time"), "set by, edge_type and time_attr on it"),
    (dict(link_split=(0.8, 0.1, 0.1), link_split_edge_type=("a", "b", "c")), "is not in the graph"),
])
def test_bad_link_splits_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        graphstore.ingest(undirected(n=50, pairs=100), tmp_path / "ds", **kwargs)
    assert not (tmp_path / "ds").exists() and not list(tmp_path.iterdir())


def test_an_edge_type_without_edges_is_refused(tmp_path):
    from torch_geometric.data import HeteroData
    import torch

    data = HeteroData()
    data["a"].x = torch.randn(5, 2)
    data["a", "to", "a"].edge_index = torch.tensor([[0, 1], [1, 2]])
    data["a", "none", "a"].edge_index = torch.zeros((2, 0), dtype=torch.long)
    with pytest.raises(InvalidInputError, match="has no edges to split"):
        graphstore.ingest(data, tmp_path / "ds", link_split=(0.8, 0.1, 0.1), link_split_edge_type="none")
    assert not (tmp_path / "ds").exists()


def test_cli_ingests_a_time_split_and_reports_it(tmp_path):
    g = undirected(n=200, pairs=1000)
    t = g.edges[None]
    np.savez(tmp_path / "g.npz", edge_index=np.stack([t.src, t.dst]),
             edge_time=t.attrs["time"].take(np.arange(t.num_edges)), num_nodes=np.array(200))
    out = subprocess.run([sys.executable, "-m", "graphstore.cli.app", "ingest", f"npz:{tmp_path / 'g.npz'}",
                          str(tmp_path / "ds"), "--parts", "2", "--link-split", "0.6,0.2,0.2", "--link-split-by",
                          "time", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)["link_splits"]["_N"]
    assert record["by"] == "time" and record["train"] + record["val"] + record["test"] == t.num_edges
    bad = subprocess.run([sys.executable, "-m", "graphstore.cli.app", "ingest", f"npz:{tmp_path / 'g.npz'}",
                          str(tmp_path / "ds2"), "--link-split", "0.6,0.2,0.3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "summing to 1" in bad.stderr and not (tmp_path / "ds2").exists()
