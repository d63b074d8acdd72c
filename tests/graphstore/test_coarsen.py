"""METIS on a coarsened graph: what ingest does when the graph does not fit one task's memory budget."""

from __future__ import annotations

import numpy as np
import pytest

from graphstore.ingest.adjacency import NodeSpace
from graphstore.ingest.budget import MIN_TASK_BYTES, Budget
from graphstore.ingest.coarsen import coarsen, load_level, weight_floor
from graphstore.ingest.engine import LocalEngine
from graphstore.ingest.partition import _adjacency, _temp_scratch, partition_graph, partition_nodes
from graphstore.ingest.synthetic import parse_synthetic_spec
from graphstore.ingest.synthetic_chunks import synthetic_chunked, synthetic_graph

SPEC = "nodes=60000,avg_degree=20,features=0,classes=4,seed=3"
SMALL = Budget(MIN_TASK_BYTES)  # 64 MiB a task: far too little for METIS on 60,000 nodes and 1.2M edges


def _train(spec):
    return {None: synthetic_graph(spec).nodes[None].attrs["train_mask"].take(np.arange(spec.nodes)).astype(bool)}


def _coarse(engine, spec):
    with _temp_scratch() as scratch:
        return partition_graph(synthetic_chunked(spec), 4, "metis", 0, engine=engine, scratch=scratch,
                               budget=SMALL, train=_train(spec))


def _quality(spec, parts):
    graph = synthetic_graph(spec)
    src, dst = graph.edges[None].src, graph.edges[None].dst
    train = _train(spec)[None]
    loads = [np.bincount(parts, minlength=4), np.bincount(parts[train], minlength=4),
             np.bincount(parts[dst], minlength=4)]
    return float(np.mean(parts[src] != parts[dst])), max(float(x.max() / x.mean()) for x in loads)


def test_a_budget_too_small_for_metis_coarsens_and_cuts_like_whole_metis():
    spec = parse_synthetic_spec(SPEC)
    assert not SMALL.metis_fits(spec.nodes, 2 * spec.num_edges)
    got, details = _coarse(LocalEngine(), spec)
    whole, whole_details = partition_nodes(synthetic_graph(spec), 4, "metis")
    assert "metis_coarse_vertices" not in whole_details  # the machine's budget fits the whole graph
    assert details["metis_coarse_vertices"] <= spec.nodes // 4  # METIS saw clusters, not nodes
    cut, balance = _quality(spec, got[None])
    whole_cut, _ = _quality(spec, whole[None])
    assert cut <= 1.1 * whole_cut, (cut, whole_cut, details)
    assert balance <= 1.05 + 1e-9, details


def test_coarse_levels_keep_every_edge_weight_and_node_weight():
    spec = parse_synthetic_spec("nodes=20000,avg_degree=10,features=0,classes=4,seed=1")
    with _temp_scratch() as scratch:
        space = NodeSpace.build({None: spec.nodes}, 3)
        _, entries, degree = _adjacency(synthetic_chunked(spec), space, LocalEngine(), scratch, None)
        weight = np.random.default_rng(0).random(spec.nodes) + 0.5
        levels, top, hist = coarsen(LocalEngine(), scratch, space.level, weight, degree, 200, lambda v, e: v <= 200)
        cluster = levels[0][1]
        for _, nxt in levels[1:]:
            cluster = nxt[cluster]
        xadj, adjncy, adjwgt = load_level(scratch, top, 1)
        fine_x, fine_adj, _ = load_level(scratch, space.level, 1)
    assert top.size < spec.nodes // 10 and cluster.max() + 1 == top.size
    # every fine edge between two clusters is one unit of weight between them, in both directions
    owner = np.repeat(np.arange(spec.nodes), np.diff(fine_x))
    a, c = cluster[owner], cluster[fine_adj]
    want = np.bincount((a * top.size + c)[a != c], minlength=top.size ** 2)
    got = np.zeros(top.size ** 2, np.int64)
    np.add.at(got, np.repeat(np.arange(top.size), np.diff(xadj)) * top.size + adjncy, adjwgt)
    np.testing.assert_array_equal(got, want)
    assert hist[0].sum() == len(adjncy) and hist[1].sum() == adjwgt.sum()
    assert entries == len(fine_adj)


def test_weight_floor_keeps_the_heaviest_within_the_limit():
    hist = np.zeros(64, np.int64)
    hist[0], hist[1], hist[3] = 1000, 100, 10  # weights 1, 2-3, 8-15
    assert weight_floor(hist, 2000) == 1 and weight_floor(hist, 110) == 2 and weight_floor(hist, 50) == 4
    assert weight_floor(hist, 5) == 16


@pytest.mark.distributed
@pytest.mark.slow
def test_the_coarse_path_on_dask_gives_the_local_partition():
    distributed = pytest.importorskip("distributed")
    from graphstore.ingest.engine import DaskEngine

    spec = parse_synthetic_spec(SPEC)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GB",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        on_dask, details = _coarse(DaskEngine(client), spec)
    here, here_details = _coarse(LocalEngine(), spec)
    np.testing.assert_array_equal(on_dask[None], here[None])
    assert details == here_details


def test_contracting_into_more_clusters_than_an_int32_pair_key_holds_keeps_every_edge():
    """60,000 clusters: a (cluster, cluster) key of 32-bit labels would wrap (60,000**2 > 2**31)."""
    from graphstore.ingest.adjacency import Level
    from graphstore.ingest.coarsen import contract

    n, count = 120_000, 60_000
    rng = np.random.default_rng(2)
    u, v = rng.integers(0, n, 200_000), rng.integers(0, n, 200_000)
    u, v = np.concatenate([u, v]), np.concatenate([v, u])
    key = np.unique(u[u != v] * n + v[u != v])
    cluster = (np.arange(n) % count).astype(np.int32)
    with _temp_scratch() as scratch:
        scratch.put("fine/00000", {"counts": np.bincount(key // n, minlength=n), "adjncy": (key % n).astype(np.int32)})
        stored = scratch.put_array("fine.cluster.npy", cluster)
        top, _ = contract(LocalEngine(), scratch, Level("fine", np.array([0, n])), stored, count, "coarse")
        xadj, adjncy, adjwgt = load_level(scratch, top, 1)
    a, c = cluster[key // n].astype(np.int64), cluster[key % n].astype(np.int64)
    pairs, weights = np.unique((a * count + c)[a != c], return_counts=True)
    got = np.repeat(np.arange(count, dtype=np.int64), np.diff(xadj)) * count + adjncy
    assert top.size == count and adjwgt.sum() == int(np.count_nonzero(a != c))
    np.testing.assert_array_equal(got, pairs)
    np.testing.assert_array_equal(adjwgt, weights)
