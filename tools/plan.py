"""Plan a graph's ingest and training from measured costs: a small cost model fitted to the benchmark records.

    .venv/bin/python tools/plan.py --nodes 111M --edges 1.6B --features 128 --machines 8
    .venv/bin/python tools/plan.py --nodes 12M --edges 240M --features 16 --machines 4 --check

Predicts the ingest's wall time and worker-seconds on ``--workers`` Dask workers and the peak memory of a
worker, of the client and of the whole process tree; the dataset's bytes on disk; a training rank's memory
(private, plus the pages of its partition the page cache should hold); and the bytes on the wire per training
epoch. Every figure names the records it was fitted to (under ``--records``, default the repo's
``benchmarks/``) and whether it is measured or an assumption; docs/planning.md explains the model.

``--check`` predicts every measured ingest size at or above ``--fit-below`` (default: the largest measured size)
from the sizes below it, prints predicted against measured time and memory and exits 1 when one is off by
more than 25%.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.25  # --check fails beyond this relative error
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_BYTES = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}
# Bytes per node that are not features, from FORMAT.md: orig_id (int64), the CSC indptr (int64), y (int64) and
# the train/val/test masks (bool): the records all have degree 20, so their disk bytes cannot split nodes from edges
FORMAT_NODE_BYTES = 8 + 8 + 8 + 3
DENSE_MAX_NODES = 1 << 24  # sampling/idmap.py: up to this many nodes the de-dup map is dense, 4.125 B per node
PERHOP_DENSE_MAX_NODES = 1 << 21  # sampling/idmap.py: the per-hop driver's (several partitions) dense map limit
SYNTHETIC_TRAIN_FRACTION = 0.6  # synthetic:'s default: the bench_rank_memory datasets' training nodes
SEED_BYTES = 12  # int64 seed list and its int32 shuffled order, per training seed of a rank (sampling/order.py)


class PlanInputError(ValueError):
    """A flag or a record the plan cannot use; the message names it and the fix."""


def parse_count(text: str, flag: str) -> int:
    """``111M``, ``1.6B``, ``2.4e6``, ``1,000`` or ``12_000`` as a positive integer.

    Examples
    --------
    >>> parse_count("1.6B", "--edges"), parse_count("111M", "--nodes"), parse_count("2.4e6", "--nodes")
    (1600000000, 111000000, 2400000)
    """
    m = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([KMBGT]?)\s*", text, re.IGNORECASE)
    value = float(m.group(1).replace(",", "").replace("_", "")) * _SCALE[m.group(2).upper()] if m else 0.0
    if not m or value < 1 or not math.isfinite(value) or abs(value - round(value)) > 1e-6 * value:
        raise PlanInputError(f"{flag} {text!r} is not a positive whole count; write it as 1600000000, 1.6B or 1.6e9")
    return round(value)


def parse_bytes(text: str, flag: str) -> int:
    """``1GB`` (10**9), ``512MiB`` (2**29), ``4e9`` as bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([KMGT]?I?B?)\s*", text, re.IGNORECASE)
    if not m or m.group(2).upper() not in _BYTES:
        raise PlanInputError(f"{flag} {text!r} is not a size; write it as 1GB, 512MiB or 1e9")
    return round(float(m.group(1)) * _BYTES[m.group(2).upper()])


def spec_fields(spec: str) -> dict[str, float]:
    """The ``key=value`` numbers of a ``synthetic:`` / ``pairs:`` spec (``{}`` for anything else)."""
    out = {}
    for part in spec.split(":", 1)[-1].split(","):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


def _number(value: Any) -> float | None:
    """A record cell as a number: numbers as they are, ``"30,000,000"``, ``"82.9"``, ``"1.02 GB"``; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = re.search(r"-?[0-9][0-9,]*(?:\.[0-9]+)?", str(value or ""))
    return float(m.group(0).replace(",", "")) if m else None


# ---------------------------------------------------------------- records

def load_records(root: Path, bench: str) -> list[tuple[str, dict[str, Any]]]:
    """``(name, record)`` of every record of ``bench`` under ``root``, oldest first (by date, then name)."""
    found = []
    for path in sorted((Path(root) / bench).glob("*.json")):
        try:
            found.append((f"{bench}/{path.name}", json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            raise PlanInputError(f"record {path} cannot be read ({exc}); fix or remove it") from exc
    return sorted(found, key=lambda item: (str(item[1].get("date", "")), item[0]))


@dataclass(frozen=True)
class IngestRow:
    """One measured ingest (one graph on one engine), normalised from either record format."""

    source: str
    workers: int
    memory_limit: int
    nodes: int
    edges: int
    features: int
    seconds: float
    peak_gb: float
    cpu_seconds: float | None = None
    worker_peak_gb: float | None = None
    client_peak_gb: float | None = None
    disk_bytes: float | None = None


def _spec_for(row: dict[str, Any], specs: list[str], edges: float) -> dict[str, float]:
    """The spec of a row: its ``graph`` when that is a spec, else the spec whose nodes x avg_degree is its
    edge count."""
    if ":" in str(row.get("graph", "")):
        return spec_fields(row["graph"])
    for spec in specs:
        f = spec_fields(spec)
        if abs(f.get("nodes", 0) * f.get("avg_degree", 10) - edges) <= 0.01 * edges:
            return f
    return {}


def _ingest_row(row: dict[str, Any], name: str, params: dict[str, Any]) -> IngestRow | None:
    """A Dask row of a bench_ingest record (numbers, or the older formatted cells), None for other rows."""
    if not str(row.get("engine", "")).startswith("dask"):
        return None
    edges = _number(row.get("edges", row.get("directed edges")))
    seconds = _number(row.get("seconds"))
    peak = _number(row.get("peak_rss_gb", row.get("peak RSS, whole tree (GB)")))
    if not edges or seconds is None or peak is None:
        return None
    spec = _spec_for(row, [str(g) for g in params.get("graphs", [])], edges)
    nodes = _number(row.get("nodes")) or spec.get("nodes")
    if not nodes:
        return None
    disk = _number(row.get("disk_gb"))
    return IngestRow(name, int(params.get("workers", 2)), parse_bytes(str(params.get("memory_limit", "4GB")), name),
                     int(nodes), int(edges), int(spec.get("features", 64)), seconds, peak,
                     _number(row.get("cpu_seconds")), _number(row.get("worker_peak_gb")),
                     _number(row.get("client_peak_gb")), disk * 1e9 if disk is not None else None)


def ingest_rows(root: Path, memory_limit: int) -> list[IngestRow]:
    """The Dask ingests measured with workers of ``memory_limit``: per edge count, the newest record's row."""
    newest: dict[int, IngestRow] = {}
    for name, rec in load_records(root, "bench_ingest"):
        for row in (rec.get("figures") or {}).get("rows", []):
            parsed = _ingest_row(row, name, rec.get("parameters") or {})
            if parsed is not None and parsed.memory_limit == memory_limit:
                newest[parsed.edges] = parsed  # records are oldest first: a newer one replaces
    return [newest[e] for e in sorted(newest)]


# ---------------------------------------------------------------- the ingest model

@dataclass(frozen=True)
class Line:
    """``intercept + slope * x``, fitted by least squares (through the origin from one point)."""

    intercept: float
    slope: float
    points: int

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(xs: list[float], ys: list[float], memory: bool = False) -> Line:
    """The least-squares line through ``(xs, ys)``. A single size gives a line through the origin, or for a
    ``memory`` a constant; a memory whose fitted slope is negative (noise: it cannot shrink as the graph
    grows) is taken as flat at its largest measured value."""
    if not xs:
        raise PlanInputError("no measured size to fit; run tools/bench_ingest.py or lower --fit-below")
    if len(set(xs)) == 1:
        return Line(float(np.mean(ys)), 0.0, len(xs)) if memory else Line(0.0, float(np.mean(ys)) / xs[0], len(xs))
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    if memory and slope < 0:
        return Line(float(max(ys)), 0.0, len(xs))
    return Line(float(intercept), float(slope), len(xs))


@dataclass(frozen=True)
class IngestModel:
    """Per-edge lines fitted on the measured sizes: wall seconds, CPU seconds and peaks; per-node for the client."""

    rows: tuple[IngestRow, ...]
    seconds: Line
    cpu_seconds: Line | None
    peak_gb: Line
    worker_peak_gb: Line | None
    client_peak_gb: Line | None
    edge_bytes: float | None  # on disk per edge, features and per-node format bytes taken out

    @property
    def workers(self) -> int:
        return self.rows[-1].workers

    @property
    def features(self) -> int:
        return self.rows[-1].features


def _optional_fit(rows: list[IngestRow], x: str, y: str, memory: bool = False) -> Line | None:
    have = [r for r in rows if getattr(r, y) is not None]
    return fit_line([getattr(r, x) for r in have], [getattr(r, y) for r in have], memory) if have else None


def fit_ingest(rows: list[IngestRow], below: int | None = None) -> IngestModel:
    """Fit on the rows with fewer than ``below`` edges (all rows when None)."""
    used = [r for r in rows if below is None or r.edges < below]
    if not used:
        raise PlanInputError(f"no Dask ingest record below {below:,} edges to fit; lower --fit-below or record a "
                             "smaller size with tools/bench_ingest.py")
    disk = [r for r in used if r.disk_bytes is not None]
    edge_bytes = (sum(r.disk_bytes - (4 * r.features + FORMAT_NODE_BYTES) * r.nodes for r in disk)
                  / sum(r.edges for r in disk)) if disk else None
    return IngestModel(tuple(used), fit_line([r.edges for r in used], [r.seconds for r in used]),
                       _optional_fit(used, "edges", "cpu_seconds"), fit_line([r.edges for r in used],
                       [r.peak_gb for r in used], memory=True), _optional_fit(used, "edges", "worker_peak_gb", True),
                       _optional_fit(used, "nodes", "client_peak_gb", True), edge_bytes)


def predict_ingest(model: IngestModel, nodes: int, edges: int, features: int, workers: int) -> dict[str, Any]:
    """The ingest of (nodes, edges, features) on ``workers`` workers like the measured ones: the intercept
    (start-up) stays, the per-edge work spreads over the workers (an assumption: every run had the same count),
    and feature bytes beyond the measured width cost what a measured stored byte cost."""
    extra = 4.0 * max(features - model.features, 0) * nodes
    per_edge_stored = model.rows[-1].disk_bytes / model.rows[-1].edges if model.rows[-1].disk_bytes else None
    seconds = model.seconds.slope * edges + (model.seconds.slope / per_edge_stored * extra if per_edge_stored else 0)
    cpu = None
    if model.cpu_seconds is not None:
        cpu = model.cpu_seconds(edges) + (model.cpu_seconds.slope / per_edge_stored * extra if per_edge_stored else 0)
    return {"seconds": model.seconds.intercept + seconds * model.workers / workers, "cpu_seconds": cpu,
            "peak_gb": model.peak_gb(edges),
            "worker_peak_gb": model.worker_peak_gb(edges) if model.worker_peak_gb else None,
            "client_peak_gb": model.client_peak_gb(nodes) if model.client_peak_gb else None}


def dataset_bytes(model: IngestModel | None, nodes: int, edges: int, features: int) -> dict[str, float] | None:
    """Bytes on disk: features (float32) + format bytes per node + measured bytes per edge."""
    if model is None or model.edge_bytes is None:
        return None
    parts = {"features": 4.0 * features * nodes, "nodes": float(FORMAT_NODE_BYTES * nodes),
             "edges": model.edge_bytes * edges}
    return {**parts, "total": sum(parts.values())}


CHECKED = (("seconds", "seconds"), ("peak_gb", "peak RSS, tree (GB)"), ("worker_peak_gb", "worker peak (GB)"))
SHOWN = (("cpu_seconds", "worker-seconds"), ("client_peak_gb", "client peak (GB)"), ("disk_gb", "disk (GB)"))


def check(rows: list[IngestRow], below: int | None) -> tuple[list[dict[str, Any]], bool]:
    """Predict each measured size at or above ``below`` (default: the largest) from the smaller ones.
    Returns the comparison rows and whether every checked figure is within ``TOLERANCE``."""
    if not rows:
        raise PlanInputError("no Dask ingest record to check; run tools/bench_ingest.py first")
    below = below if below is not None else rows[-1].edges
    model = fit_ingest(rows, below)
    out, ok = [], True
    for row in (r for r in rows if r.edges >= below):
        got = predict_ingest(model, row.nodes, row.edges, row.features, row.workers)
        data = dataset_bytes(model, row.nodes, row.edges, row.features)
        got["disk_gb"] = data["total"] / 1e9 if data else None
        for key, label in CHECKED + SHOWN:
            measured = row.disk_bytes / 1e9 if key == "disk_gb" and row.disk_bytes else getattr(row, key, None)
            if measured is None or got[key] is None:
                continue
            error = (got[key] - measured) / measured
            gated = (key, label) in CHECKED
            ok &= not gated or abs(error) <= TOLERANCE
            out.append({"edges": row.edges, "figure": label, "predicted": float(f"{got[key]:.4g}"),
                        "measured": measured, "error_pct": round(100 * error, 1), "gated": gated,
                        "record": row.source, "fitted_on": sorted({r.edges for r in model.rows})})
    return out, ok


# ---------------------------------------------------------------- training: a rank's memory, the wire

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
    newest ``bench_rank_memory`` record with the plan's fanout: ``intercept_gb + per_node_b * nodes / 1e9``."""

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
        if str(params.get("fanout", "10,5")) != fanout:
            continue
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


# ---------------------------------------------------------------- the command line

def _fmt_bytes(n: float) -> str:
    return f"{n / 1e12:.2f} TB" if n >= 1e12 else f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _fmt_seconds(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _fitted(model: IngestModel) -> str:
    sizes = ", ".join(f"{r.edges / 1e6:g}M" for r in model.rows)
    return f"measured: fit on {sizes} edges ({', '.join(sorted({r.source for r in model.rows}))})"


def ingest_lines(args: argparse.Namespace, model: IngestModel) -> list[tuple[str, str, str]]:
    got = predict_ingest(model, args.nodes, args.edges, args.features, args.workers)
    lines = [(f"ingest wall time, {args.workers} workers", _fmt_seconds(got["seconds"]),
              f"{_fitted(model)}; {model.seconds.intercept:.0f} s + {model.seconds.slope * 1e6:.2f} s per M edges "
              f"on {model.workers} workers, the per-edge part divided over the workers (assumption)")]
    if got["cpu_seconds"] is not None:
        lines.append(("ingest worker-seconds (CPU)", _fmt_seconds(got["cpu_seconds"]),
                      f"measured: {model.cpu_seconds.slope * 1e6:.2f} CPU s per M edges"))
    for key, label, line in (("worker_peak_gb", "peak memory per worker", model.worker_peak_gb),
                             ("client_peak_gb", "peak memory of the client", model.client_peak_gb)):
        if line is not None:
            unit = "M nodes" if key == "client_peak_gb" else "M edges"
            lines.append((label, f"{got[key]:.2f} GB", f"measured: {line.intercept:.2f} GB + "
                          f"{line.slope * 1e6 * 1e3:.2f} MB per {unit} (workers of {args.memory_limit})"))
    if got["worker_peak_gb"] is not None and got["worker_peak_gb"] * 1e9 > args.memory_bytes:
        lines.append(("", "", f"warning: above the {args.memory_limit} worker limit the runs had; tasks plan for half "
                      "of it, so the slope is noise or growth the budget misses: give workers this much, or measure"))
    if model.worker_peak_gb is None:
        lines.append((f"peak memory, client + {model.workers} workers", f"{got['peak_gb']:.2f} GB",
                      f"measured: {model.peak_gb.intercept:.2f} GB + {model.peak_gb.slope * 1e9:.1f} MB per M edges"))
    if args.features > model.features:
        lines.append(("", "", f"assumption: the {args.features - model.features} feature columns beyond the "
                      f"measured {model.features} cost what a measured stored byte cost"))
    return lines


def training_lines(args: argparse.Namespace, train: dict[str, Any]) -> list[tuple[str, str, str]]:
    lines = []
    if "rank_fit" in train:
        fit = train["rank_fit"]
        measured = ", ".join(f"{g:.2f} GB at {n / 1e6:g}M" for n, g in fit.points)
        lines.append(("rank memory, private", f"{train['rank_private_gb']:.2f} GB",
                      f"measured ({fit.source}, batch {fit.batch_size}): peak private memory per rank against its "
                      f"nodes, {measured}; fitted {fit.intercept_gb:.2f} GB + {fit.per_node_b:.1f} B per node of the "
                      f"rank, of which {SEED_BYTES} B per training node (seed lists) at the measured train fraction "
                      f"{SYNTHETIC_TRAIN_FRACTION:g}, here {args.train_fraction:g}; assumed: the step's memory "
                      "does not change with features, classes or batch size"))
    elif "rank_private_gb" in train:
        dense_max = DENSE_MAX_NODES if args.machines == 1 else PERHOP_DENSE_MAX_NODES
        lines.append(("rank memory, private", f"{train['rank_private_gb']:.2f} GB",
                      f"measured: the largest per-rank peak RSS ({', '.join(train['rank_sources'])}); plus, from "
                      f"the code: {SEED_BYTES} B per training seed and, up to {dense_max:,} nodes, a 4.125 B per "
                      "node de-dup map per loader thread"))
    if "rank_mapped_gb" in train:
        lines.append(("rank memory, its partition mapped", f"{train['rank_mapped_gb']:.2f} GB",
                      "the dataset / machines: page cache the machine should hold for full speed"))
    if "rpc_bytes" in train:
        b = train["wire_basis"]
        spread = ", ".join(f"{r:.1f}" for r in b.others)
        lines += [("wire per epoch, RPC, all machines", _fmt_bytes(train["rpc_bytes"]),
                   f"measured: {b.rows_per_seed:.1f} remote rows per seed at fanout {','.join(map(str, b.fanout))} "
                   f"({b.source}, {b.nodes:,} nodes, {b.hosts} hosts; other runs {spread}); assumptions: x (1 - 1/M), "
                   "rows scale with the nodes a seed reaches, a row is 4F B plus its IDs"),
                  ("wire per epoch, per machine", _fmt_bytes(train["wire_bytes_per_machine"]),
                   f"RPC / M + gradient all-reduce {_fmt_bytes(train['allreduce_bytes_per_machine'])} (SAGE weights "
                   "x steps, as the trainer counts it)")]
    return lines


def dataset_line(data: dict[str, float] | None, model: IngestModel | None) -> list[tuple[str, str, str]]:
    if data is None:
        return [("dataset on disk", "?", "no ingest record with bytes on disk")]
    return [("dataset on disk", _fmt_bytes(data["total"]),
             f"features {_fmt_bytes(data['features'])} (4F B/node) + {FORMAT_NODE_BYTES} B/node (format) + "
             f"{model.edge_bytes:.1f} B/edge (measured: {', '.join(sorted({r.source for r in model.rows}))})")]


def table(title: str, lines: list[tuple[str, str, str]]) -> str:
    rows = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in lines)
    return f"{title}\n\n| figure | prediction | basis |\n|---|---|---|\n{rows}"


def check_table(rows: list[dict[str, Any]]) -> str:
    body = "\n".join(f"| {r['edges']:,} | {r['figure']} | {r['predicted']:g} | {r['measured']:g} | "
                     f"{r['error_pct']:+.1f}% | {'yes' if r['gated'] else 'no'} | {r['record']} |" for r in rows)
    return ("| edges | figure | predicted | measured | error | gated (25%) | record |\n|---|---|---|---|---|---|---|\n"
            + body)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints the usage too)
        raise PlanInputError(f"{message}; see tools/plan.py --help")


def parser() -> argparse.ArgumentParser:
    p = _Parser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", help="nodes, e.g. 111M (required except with --check)")
    p.add_argument("--edges", help="stored directed edges (both directions of an undirected edge), e.g. 1.6B")
    p.add_argument("--features", help="float32 features per node")
    p.add_argument("--machines", help="training machines, one rank each")
    p.add_argument("--workers", help="Dask workers of the ingest (default: 2 per machine, as measured)")
    p.add_argument("--memory-limit", default="1GB",
                   help="each worker's memory limit: selects the records (default 1GB)")
    p.add_argument("--train-fraction", type=float, default=0.6,
                   help="seeds per epoch / nodes (default 0.6, synthetic's)")
    p.add_argument("--fanout", default="10,5", help="per hop (default 10,5, as measured)")
    p.add_argument("--batch-size", default="256", help="seeds per step (default 256, as bench_cluster measured)")
    p.add_argument("--hidden", default="128", help="hidden width of the GraphSAGE (default 128)")
    p.add_argument("--classes", default="6", help="output classes (default 6, as bench_cluster measured)")
    p.add_argument("--loader-threads", default="1", help="sampling threads per rank (default 1)")
    p.add_argument("--records", type=Path, default=ROOT / "benchmarks", help="benchmark records (default benchmarks/)")
    p.add_argument("--fit-below",
                   help="fit the ingest only on sizes with fewer edges (default: all; --check: the largest)")
    p.add_argument("--check", action="store_true", help="predict the measured sizes at or above --fit-below from "
                   "those below; exit 1 if a time or memory is off by more than 25%%")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    missing = [f"--{f}" for f in ("nodes", "edges", "features", "machines") if getattr(args, f) is None]
    if missing and not args.check:
        raise PlanInputError(f"{', '.join(missing)} required, e.g. --nodes 111M --edges 1.6B --features 128 "
                             "--machines 8 (--check alone needs none)")
    for flag in ("nodes", "edges", "features", "machines", "batch_size", "hidden", "classes", "loader_threads"):
        if getattr(args, flag) is not None:
            setattr(args, flag, parse_count(getattr(args, flag), "--" + flag.replace("_", "-")))
    args.workers = parse_count(args.workers, "--workers") if args.workers else 2 * (args.machines or 1)
    args.fit_below = parse_count(args.fit_below, "--fit-below") if args.fit_below else None
    args.memory_bytes = parse_bytes(args.memory_limit, "--memory-limit")
    try:
        args.fanout = [int(k) for k in args.fanout.split(",")]
    except ValueError:
        args.fanout = []
    if not args.fanout or min(args.fanout) < 1:
        raise PlanInputError(f"--fanout {args.fanout!r} must be positive integers per hop, e.g. 10,5")
    if not 0 < args.train_fraction <= 1:
        raise PlanInputError(f"--train-fraction {args.train_fraction} must be in (0, 1], e.g. 0.0109 for "
                             "papers100M's split")
    if not args.records.is_dir():
        raise PlanInputError(f"--records {args.records} is not a folder; pass the benchmarks/ folder of a checkout")
    return args


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    """The figures, their text and the exit code."""
    rows = ingest_rows(args.records, args.memory_bytes)
    if args.check:
        compared, ok = check(rows, args.fit_below)
        return {"check": compared, "ok": ok}, check_table(compared), 0 if ok else 1
    model = fit_ingest(rows, args.fit_below) if rows else None
    data = dataset_bytes(model, args.nodes, args.edges, args.features)
    train = predict_training(args, data, args.records)
    lines = ingest_lines(args, model) if model else [("ingest", "?", "no Dask ingest record with workers of "
                                                      f"{args.memory_limit}; pass --memory-limit of a recorded run")]
    lines += dataset_line(data, model) + training_lines(args, train)
    title = (f"{args.nodes:,} nodes, {args.edges:,} edges, {args.features} features; {args.machines} machines, "
             f"{args.workers} ingest workers; fanout {','.join(map(str, args.fanout))}, batch {args.batch_size}, "
             f"train fraction {args.train_fraction:g}")
    figures = {"ingest": predict_ingest(model, args.nodes, args.edges, args.features, args.workers) if model else None,
               "dataset_bytes": data,
               "training": {k: (asdict(v) if k in ("wire_basis", "rank_fit") else v) for k, v in train.items()},
               "lines": [dict(zip(("figure", "prediction", "basis"), line)) for line in lines]}
    return figures, table(title, lines), 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        figures, text, code = run(args)
    except PlanInputError as exc:
        print(f"plan.py: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(figures, indent=1) if args.json else text)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
