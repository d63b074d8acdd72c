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
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_model import (FORMAT_NODE_BYTES, TOLERANCE, IngestModel, PlanInputError, check,  # noqa: E402,F401
                        dataset_bytes, fit_ingest, fit_line, ingest_rows, parse_bytes, predict_ingest)
from plan_training import (DENSE_MAX_NODES, PERHOP_DENSE_MAX_NODES, SEED_BYTES,  # noqa: E402,F401
                           SYNTHETIC_TRAIN_FRACTION, id_bytes, nodes_per_seed, predict_training, sage_parameters)

ROOT = Path(__file__).resolve().parents[1]
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


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
