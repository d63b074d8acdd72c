"""Partitioners: balance, METIS quality, and METIS on a uniform edge sample for huge graphs."""

from __future__ import annotations

import numpy as np
import pytest

import graphstore
from graphstore.ingest.partition import _keep_undirected, partition_nodes, symmetric_adjacency
from graphstore.ingest.synthetic import parse_synthetic_spec, synthetic_graph

SPEC = "nodes=4000,avg_degree=10,features=4,classes=4,seed=5"


def _cut(source, assign):
    table = source.edges[None]
    return float(np.mean(assign[None][table.src] != assign[None][table.dst]))


@pytest.mark.parametrize("method", ["metis", "random", "range"])
def test_partitions_are_balanced(method):
    source = synthetic_graph(parse_synthetic_spec(SPEC))
    assign, _ = partition_nodes(source, 4, method)
    counts = np.bincount(assign[None], minlength=4)
    assert counts.sum() == 4000 and counts.max() / counts.mean() < 1.05
    train = source.nodes[None].attrs["train_mask"].take(np.arange(4000))
    train_counts = np.bincount(assign[None][train], minlength=4)
    assert train_counts.max() / train_counts.mean() < 1.1  # METIS balances train nodes too


def test_metis_cuts_far_fewer_edges_than_random():
    source = synthetic_graph(parse_synthetic_spec(SPEC))
    metis, _ = partition_nodes(source, 4, "metis")
    rand, _ = partition_nodes(source, 4, "random")
    assert _cut(source, metis) < 0.5 * _cut(source, rand)


def test_edge_sample_keeps_both_directions_of_an_edge():
    total = 1000
    rng = np.random.default_rng(0)
    u, v = rng.integers(0, total, 5000), rng.integers(0, total, 5000)
    key = np.unique(np.concatenate([u * total + v, v * total + u]))
    keep = _keep_undirected(key, total, 0.3, seed=1)
    kept = set(key[keep].tolist())
    assert 0.2 < keep.mean() < 0.4
    assert all(((k % total) * total + k // total) in kept for k in kept)


def test_metis_on_an_edge_sample_still_partitions_well(tmp_path):
    source = synthetic_graph(parse_synthetic_spec(SPEC))
    offsets, total = {None: 0}, 4000
    _, adjncy_full, full = symmetric_adjacency(source, offsets, total)
    _, adjncy, fraction = symmetric_adjacency(source, offsets, total, max_edges=len(adjncy_full) // 4)
    assert full == 1.0 and 0.4 < fraction < 0.6 and len(adjncy) < 0.6 * len(adjncy_full)
    sampled, details = partition_nodes(source, 4, "metis", metis_max_edges=len(adjncy_full) // 4)
    rand, _ = partition_nodes(source, 4, "random")
    assert details["metis_edge_fraction"] == pytest.approx(fraction)
    assert _cut(source, sampled) < 0.6 * _cut(source, rand)
    summary = graphstore.ingest(f"synthetic:{SPEC}", tmp_path / "d", num_parts=4, metis_max_edges=5000)
    assert graphstore.open_dataset(tmp_path / "d").manifest.partitioning["metis_edge_fraction"] < 1
    assert summary.edge_cut_fraction < 0.6
