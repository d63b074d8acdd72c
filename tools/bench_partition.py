"""Benchmark METIS balance: every constraint's max/mean and the edge cut, old weights vs today's partitioner.

"before" re-runs the previous call in the same process: multi-constraint k-way METIS with weights
(nodes, train nodes, sampled degree + 1). "after" is ``partition_nodes(..., "metis")``: stored
in-degree as the edge weight, recursive bisection when k-way misses 1.05, then the boundary repair.

    .venv/bin/python tools/bench_partition.py                      # issue-18 random graph + power-law, 2/4/8/16
    .venv/bin/python tools/bench_partition.py --graphs cora facebook --parts 2 4 8 16
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from graphstore.ingest.partition import partition_nodes, symmetric_adjacency
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable
from graphstore.ingest.sources import resolve_source
from graphstore.ingest.synthetic import parse_synthetic_spec
from graphstore.ingest.synthetic_chunks import synthetic_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def random_graph(nodes: int = 100_000, pairs: int = 1_000_000, train: float = 0.1, seed: int = 0) -> GraphSource:
    """The issue-18 graph: ``pairs`` uniform random pairs made undirected, a random ``train`` fraction."""
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, nodes, pairs), rng.integers(0, nodes, pairs)
    mask = np.zeros(nodes, bool)
    mask[rng.permutation(nodes)[: round(train * nodes)]] = True
    return GraphSource({None: NodeTable(nodes, {"train_mask": ArrayRows(mask)})},
                       {None: EdgeTable(np.concatenate([u, v]), np.concatenate([v, u]))}, name="random")


def facebook_graph(train: float = 0.1, seed: int = 0) -> GraphSource:
    """MUSAE Facebook page-page graph (undirected), with a random ``train`` fraction as train nodes."""
    edges = np.loadtxt(DATA / "musae_facebook" / "edges.csv", delimiter=",", skiprows=1, dtype=np.int64)
    nodes = int(edges.max()) + 1
    mask = np.zeros(nodes, bool)
    mask[np.random.default_rng(seed).permutation(nodes)[: round(train * nodes)]] = True
    u, v = edges[:, 0], edges[:, 1]
    return GraphSource({None: NodeTable(nodes, {"train_mask": ArrayRows(mask)})},
                       {None: EdgeTable(np.concatenate([u, v]), np.concatenate([v, u]))}, name="facebook")


GRAPHS = {
    "random": random_graph,
    "powerlaw": lambda: synthetic_graph(parse_synthetic_spec("nodes=100000,avg_degree=20,features=0,train=0.1")),
    "cora": lambda: resolve_source(f"planetoid:{DATA / 'planetoid' / 'Cora' / 'raw'}"),
    "facebook": facebook_graph,
}


def old_partition(source: GraphSource, num_parts: int, seed: int = 0) -> np.ndarray:
    """The previous METIS call: k-way, weights (nodes, train nodes, METIS-graph degree + 1)."""
    import pymetis
    total = source.nodes[None].num_nodes
    xadj, adjncy, _ = symmetric_adjacency(source, {None: 0}, total)
    columns = [np.ones(total, np.int64)]
    if "train_mask" in source.nodes[None].attrs:
        columns.append(source.nodes[None].attrs["train_mask"].take(np.arange(total)).astype(np.int64))
    columns.append(np.diff(xadj) + 1)
    dtype = pymetis.zero_copy_dtype()
    result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj.astype(dtype), adjncy.astype(dtype)),
                                vweights=np.stack(columns, 1).ravel().astype(dtype),
                                options=pymetis.Options(seed=seed), recursive=False)
    return np.asarray(result[1], np.int32)


def measure(source: GraphSource, parts: np.ndarray, num_parts: int) -> dict[str, float]:
    """Balance (max/mean) of nodes, train nodes and stored edges (by destination), and the edge-cut fraction."""
    table = source.edges[None]
    attrs = source.nodes[None].attrs
    train = attrs["train_mask"].take(np.arange(len(parts))).astype(bool) if "train_mask" in attrs else None

    def bal(counts: np.ndarray) -> float:
        return float(counts.max() / counts.mean())
    return {"nodes": bal(np.bincount(parts, minlength=num_parts)),
            "train": bal(np.bincount(parts[train], minlength=num_parts)) if train is not None else float("nan"),
            "edges": bal(np.bincount(parts[table.dst], minlength=num_parts)),
            "cut": float(np.mean(parts[table.src] != parts[table.dst]))}


def main() -> None:
    ap = toolargs.parser(__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", choices=sorted(GRAPHS), default=["random", "powerlaw"])
    ap.add_argument("--parts", nargs="+", type=toolargs.count, default=[2, 4, 8, 16])
    ap.add_argument("--no-before", action="store_true", help="skip the old weights (halves the run time)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    benchinfo.add_seed_argument(ap)
    benchinfo.add_record_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = benchinfo.start(args, args.json)  # the graphs are fixed inputs; the seed is METIS's (before and after)
    if not args.json:
        print("| graph | parts | run | nodes | train nodes | edges | edge cut | METIS scheme | moved | seconds |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.graphs:
        source = GRAPHS[name]()
        for k in args.parts:
            for run in (("after",) if args.no_before else ("before", "after")):
                rows.append(_measure_run(source, name, k, run, args.seed % 2**31))
                if not args.json:
                    _print_row(rows[-1])
    if args.json:
        print(json.dumps({**result, "rows": rows}, indent=1))
    benchinfo.record("bench_partition", args, {**result, "rows": rows}, {"graphs": args.graphs, "parts": args.parts})


def _measure_run(source: GraphSource, name: str, k: int, run: str, seed: int) -> dict:
    start = time.perf_counter()
    if run == "before":
        parts, scheme, moved = old_partition(source, k, seed), "kway", None
    else:
        assign, details = partition_nodes(source, k, "metis", seed=seed)
        parts, scheme, moved = assign[None], details["metis_scheme"], details["rebalanced_nodes"]
    return {"graph": name, "parts": k, "run": run, **measure(source, parts, k), "scheme": scheme, "moved": moved,
            "seconds": round(time.perf_counter() - start, 2)}


def _print_row(r: dict) -> None:
    moved = "-" if r["moved"] is None else r["moved"]
    print(f"| {r['graph']} | {r['parts']} | {r['run']} | {r['nodes']:.3f} | {r['train']:.3f} | {r['edges']:.3f} "
          f"| {r['cut']:.3f} | {r['scheme']} | {moved} | {r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
