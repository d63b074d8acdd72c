"""The cost model of tools/plan.py: benchmark records read, the ingest's time and memory fitted to them and
checked against the sizes they were not fitted on, the dataset's bytes on disk (docs/planning.md)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TOLERANCE = 0.25  # --check fails beyond this relative error
# Bytes per node that are not features, from FORMAT.md: orig_id (int64), the CSC indptr (int64), y (int64) and
# the train/val/test masks (bool): the records all have degree 20, so their disk bytes cannot split nodes from edges
FORMAT_NODE_BYTES = 8 + 8 + 8 + 3
_BYTES = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}


class PlanInputError(ValueError):
    """A flag or a record the plan cannot use; the message names it and the fix."""



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
