"""The training side of tools/plan.py: a rank's memory, fitted to the bench_rank_memory records, and an
epoch's bytes on the wire, from the RPC payload bench_cluster counted (docs/planning.md)."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plan_model import _number, load_records, spec_fields

DENSE_MAX_NODES = 1 << 24  # sampling/kernels/idmap.py: up to this many nodes the de-dup map is dense, 4.125 B per node
PERHOP_DENSE_MAX_NODES = 1 << 21  # sampling/kernels/idmap.py: the per-hop driver's (several partitions) dense map limit
SYNTHETIC_TRAIN_FRACTION = 0.6  # synthetic:'s default: the bench_rank_memory datasets' training nodes
SEED_BYTES = 12  # int64 seed list and its int32 shuffled order, per training seed of a rank (sampling/loader/seed_order.py)



def _gb(cell: Any, key: str) -> float | None:
    """The largest figure of a memory cell (``"1.26–1.29 GB"``, ``"741 MB"``) in GB."""
    values = [float(v) for v in re.findall(r"[0-9]+(?:\.[0-9]+)?", str(cell))]
    if not values:
        return None
    unit = 1e-3 if "MB" in str(cell) else 2**30 / 1e9 if "GiB" in key else 1.0
    return max(values) * unit


def rank_memory_base(root: Path, fanout: str) -> tuple[float, list[str]] | None:
    """The largest per-rank peak RSS of the bench_train runs with this fanout (records without one ran
    bench_train's default, 10,5), and the records it came from; None without such a record."""
    best, sources = 0.0, []
    for name, rec in load_records(root, "bench_train"):
        if str((rec.get("parameters") or {}).get("fanout", "10,5")) != fanout:
            continue
        cells = [_gb(v, k) for row in (rec.get("figures") or {}).get("rows", []) for k, v in row.items()
                 if k.startswith("RSS/rank")]
        cells = [c for c in cells if c is not None]
        if cells:
            best, sources = max(best, max(cells)), sources + [name]
    return (best, sources) if sources else None


@dataclass(frozen=True)
class RankFit:
    """A rank's private memory (peak ``RssAnon``, the larger rank) against the nodes it holds, fitted to the
    newest ``bench_rank_memory`` record of mapped ranks with the plan's fanout:
    ``intercept_gb + per_node_b * nodes / 1e9``."""

    source: str
    intercept_gb: float
    per_node_b: float
    points: tuple[tuple[int, float], ...]  # (nodes per rank, private peak GB) as measured
    batch_size: int  # the measured runs' (a step's activations scale with it; the plan does not rescale)


def rank_memory_fit(root: Path, fanout: str) -> RankFit | None:
    """The fit of :class:`RankFit`, or None without a record of two sizes or more at this fanout."""
    found = None
    for name, rec in load_records(root, "bench_rank_memory"):  # oldest first: the last match is the newest
        params = rec.get("parameters") or {}
        if str(params.get("fanout", "10,5")) != fanout or params.get("unmapped"):
            continue  # the plan is of mapped ranks (the default); --unmapped runs hold a flat resident set
        ranks = int(params.get("ranks", 2))
        points = [(round(row["nodes"] / ranks), max(row["private_peak_mb"]) / 1e3)
                  for row in (rec.get("figures") or {}).get("rows", [])
                  if row.get("private_peak_mb") and row.get("nodes") and "failed" not in row]
        if len({n for n, _ in points}) >= 2:
            found = (name, points, int(params.get("batch_size", 1024)))
    if found is None:
        return None
    name, points, batch = found
    slope, intercept = np.polyfit([n for n, _ in points], [g for _, g in points], 1)
    return RankFit(name, float(intercept), float(slope) * 1e9, tuple(points), batch)


def id_bytes(nodes: int) -> int:
    """Whole bytes that name any node (the wire's narrowest IDs): 2 below 65,536 nodes, 3 below 16.7M."""
    return max(1, -(-(nodes - 1).bit_length() // 8))


def nodes_per_seed(fanout: list[int]) -> int:
    """Nodes a seed's sampled tree can reach: 1 + f1 + f1 f2 + ..."""
    total, width = 1, 1
    for k in fanout:
        width *= k
        total += width
    return total


def remote_share(machines: int) -> float:
    """The share of a rank's sampled rows that live on another machine: 1 - 1/M (an assumption; measured
    2 -> 4 hosts on the demo graph: 1.49x more RPC bytes per seed, against 1.5x)."""
    return 1.0 - 1.0 / machines


def _row_bytes(features: int, nodes: int, fanout: list[int]) -> int:
    """Wire bytes per remote row: its float32 features plus its ID and its last hop's neighbour IDs."""
    return 4 * features + id_bytes(nodes) * (1 + fanout[-1])


@dataclass(frozen=True)
class WireBasis:
    """Remote rows per training seed, from the RPC payload a bench_cluster run counted (its ``minimum``)."""

    source: str
    nodes: int
    hosts: int
    rows_per_seed: float  # rows per seed were every sampled node remote (the counted bytes over remote_share)
    fanout: tuple[int, ...]
    others: tuple[float, ...]  # rows_per_seed of the other measured points (the spread)


def wire_basis(root: Path) -> WireBasis | None:
    """The bench_cluster measurement on the largest graph (fewer repeats within a batch, as on a larger one)."""
    points = []
    for name, rec in load_records(root, "bench_cluster"):
        spec = spec_fields(str((rec.get("config") or {}).get("spec", "")))
        params = rec.get("parameters") or {}
        fanout = tuple(int(k) for k in str(params.get("fanout", "10,5")).split(","))
        nodes, feats = int(spec.get("nodes", 0)), int(spec.get("features", 64))
        seeds = spec.get("train", SYNTHETIC_TRAIN_FRACTION) * nodes
        for m in (rec.get("figures") or {}).get("minimum", []):
            hosts, counted = int(_number(m.get("hosts")) or 0), _number(m.get("counted MB"))
            if nodes and hosts > 1 and counted:
                rows = counted * 1e6 / (seeds * remote_share(hosts)) / _row_bytes(feats, nodes, list(fanout))
                points.append((nodes, hosts, rows, name, fanout))
    if not points:
        return None
    best = max(range(len(points)), key=lambda i: points[i][:2])
    nodes, hosts, rows, name, fanout = points[best]
    return WireBasis(name, nodes, hosts, rows, fanout, tuple(p[2] for i, p in enumerate(points) if i != best))


def sage_parameters(features: int, hidden: int, classes: int, layers: int) -> int:
    """Weights of a GraphSAGE of ``layers`` SAGEConv layers (two weight matrices and one bias each)."""
    sizes = [features] + [hidden] * (layers - 1) + [classes]
    return sum(2 * a * b + b for a, b in zip(sizes, sizes[1:]))


def predict_training(args: argparse.Namespace, dataset: dict[str, float] | None, root: Path) -> dict[str, Any]:
    """A rank's memory and an epoch's bytes on the wire on ``args.machines`` machines, one rank each."""
    seeds = args.train_fraction * args.nodes
    out: dict[str, Any] = {"seeds": seeds}
    fit = rank_memory_fit(root, ",".join(map(str, args.fanout)))
    base = rank_memory_base(root, ",".join(map(str, args.fanout))) if fit is None else None
    dense_max = DENSE_MAX_NODES if args.machines == 1 else PERHOP_DENSE_MAX_NODES
    dense = 4.125 * args.nodes * args.loader_threads if args.nodes <= dense_max else 0.0
    if fit is not None:  # measured as the graph grew: seed lists, maps and the heap's spread are in the fit
        per_rank = args.nodes / args.machines  # the seed lists of the fit's 0.6 train fraction, then of this one
        rest = fit.per_node_b - SEED_BYTES * SYNTHETIC_TRAIN_FRACTION
        out["rank_private_gb"] = fit.intercept_gb + (rest + SEED_BYTES * args.train_fraction) * per_rank / 1e9
        out["rank_fit"] = fit
    elif base is not None:
        out["rank_private_gb"] = base[0] + (dense + SEED_BYTES * seeds / args.machines) / 1e9
        out["rank_sources"] = base[1]
    if dataset is not None:
        out["rank_mapped_gb"] = dataset["total"] / args.machines / 1e9
    basis = wire_basis(root)
    steps = math.ceil(seeds / args.machines / args.batch_size)
    allreduce = steps * 4 * sage_parameters(args.features, args.hidden, args.classes, len(args.fanout))
    if basis is not None:
        rows = basis.rows_per_seed * nodes_per_seed(args.fanout) / nodes_per_seed(list(basis.fanout))
        rpc = seeds * remote_share(args.machines) * rows * _row_bytes(args.features, args.nodes, args.fanout)
        out.update(wire_basis=basis, rpc_bytes=rpc, allreduce_bytes_per_machine=allreduce,
                   wire_bytes_per_machine=rpc / args.machines + allreduce)
    return out
