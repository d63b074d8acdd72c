"""Benchmark a rank's memory as the graph grows: the same training job on datasets of one shape, several sizes.

Usage::

    python tools/bench_rank_memory.py DATASET [DATASET ...] [--ranks 2] [--fanout 10,5] [--batch-size 1024]
                                      [--eval-max-batches 20] [--unmapped] [--repeats 1] [--max-seconds 3600]
                                      [--json]

Each DATASET (a dataset path or URL, smallest first: the first is the baseline) is trained with
``graphstore-train DATASET --nproc RANKS`` for one epoch and a bounded evaluation: the first of two epochs,
with ``--eval-every 1 --eval-max-batches M``, and the tool stops the job once that epoch's metrics are
written (the last epoch's evaluation is always complete, so it is never reached). Datasets are run in turn,
``--repeats`` times (interleaved), on the same seed.

Per dataset and rank, from the ranks' own report (``metrics.json``'s ``memory_mb``):

- ``peak RSS``: the epoch's peak resident set (``VmHWM``, reset at the epoch's start), evaluation included.
  It counts the dataset's pages the rank has mapped and touched: page cache, shared with every process
  that maps them and dropped under memory pressure, not memory the rank holds;
- ``dataset pages``: those mapped pages of the dataset resident at the epoch's end;
- ``private``: the rank's anonymous memory (``RssAnon``: heap, tensors, the model), polled by this tool
  every 0.05 s while the epoch runs, and its peak;
- ``heap``: what the allocator hands out at the epoch's end, and ``heap free``: what it holds freed for reuse;
- ``kernels compiled``: the sampling-kernel specialisations each rank compiled (numba cache misses) from its
  start to the epoch's end. A rank that compiles keeps the compiler's memory in its private memory, so a
  dataset whose ranks compiled is not comparable with one whose ranks did not: run ``graphstore warmup``
  first, and the tool warns when a rank compiled.

The ratios are against the first DATASET, rank by rank (the largest of a row). A rank's memory does not grow
with the graph when the private peak stays flat; the peak RSS then grows only by the mapped dataset pages.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchinfo  # noqa: E402
import toolargs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _anon_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _ranks(pid: int) -> list[int]:
    """The launcher's rank processes (its children, less the fork server)."""
    return [c.pid for c in benchinfo.rank_processes(pid)]


def _epoch_written(metrics: Path) -> dict | None:
    try:
        epochs = json.loads(metrics.read_text())["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return epochs[0] if epochs else None


def train(dataset: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One job's first epoch: its metrics and the polled private peak of each rank (bytes, rank order by pid)."""
    metrics = out / "metrics.json"
    metrics.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "training.launch", dataset, "--nproc", str(args.ranks), "--epochs", "2",
           "--eval-every", "1", "--eval-max-batches", str(args.eval_max_batches), "--fanout", args.fanout,
           "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--no-progress",
           "--metrics-out", str(metrics)] + (["--unmapped"] if getattr(args, "unmapped", False) else [])
    log = open(out / "log", "w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    anon: dict[int, int] = {}
    epoch, deadline = None, time.monotonic() + args.max_seconds
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in _ranks(proc.pid):
                value = _anon_bytes(pid)
                if value is not None:
                    anon[pid] = max(anon.get(pid, 0), value)
            epoch = _epoch_written(metrics)
            if epoch is not None:
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.seek(0)
        tail = "\n".join(log.read().strip().splitlines()[-6:])
        log.close()
    if epoch is None:
        return {"failed": f"exit {proc.returncode}, no epoch recorded in {args.max_seconds:.0f} s: {tail}"}
    return {"epoch": epoch, "private_peak": [anon[p] for p in sorted(anon)]}


def _row(dataset: str, job: dict[str, Any]) -> dict[str, Any]:
    from graphstore import open_dataset

    manifest = open_dataset(dataset).manifest
    nodes = sum(int(t.num_nodes) for t in manifest.node_types)
    edges = sum(int(t.num_edges) for t in manifest.edge_types)
    row: dict[str, Any] = {"dataset": dataset, "nodes": nodes, "edges": edges}
    if "failed" in job:
        row["failed"] = job["failed"]
        return row
    e, mb = job["epoch"], job["epoch"].get("memory_mb", {})
    row.update(steps=e["steps"], epoch_seconds=e["epoch_seconds"], peak_rss_mb=mb.get("peak_rss"),
               dataset_pages_mb=mb.get("dataset_rss"), private_end_mb=mb.get("anon"),
               private_peak_mb=[round(b / 2**20, 1) for b in job["private_peak"]], heap_mb=mb.get("heap_in_use"),
               heap_free_mb=mb.get("heap_free"), kernels_compiled=e.get("kernels_compiled", {}).get("run"),
               loss=e.get("loss"))
    return row


def _ratios(rows: list[dict[str, Any]], first: str) -> None:
    base = [r for r in rows if r["dataset"] == first and "failed" not in r]
    if not base:
        return
    for key in ("peak_rss_mb", "private_peak_mb", "dataset_pages_mb"):
        ref = sum(max(r[key]) for r in base) / len(base)
        for r in rows:
            if "failed" not in r and r.get(key) and ref:
                r[f"{key.removesuffix('_mb')}_ratio"] = round(max(r[key]) / ref, 3)


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n")[0])
    parser.add_argument("datasets", nargs="+", type=toolargs.dataset,
                        help="dataset paths or URLs of one shape, smallest (the baseline) first")
    parser.add_argument("--ranks", type=toolargs.count, default=2)
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--eval-max-batches", type=toolargs.count, default=20,
                        help="evaluation batches per rank and split after the measured epoch (the bound)")
    parser.add_argument("--unmapped", action="store_true",
                        help="train with --unmapped: the ranks read their partitions with pread, never mapped")
    parser.add_argument("--repeats", type=toolargs.count, default=1)
    parser.add_argument("--max-seconds", type=toolargs.positive, default=3600,
                        help="give up on a job after this long (reported as not finishing its epoch)")
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args()  # counts >= 1 and datasets that exist: checked by the parser
    out = benchinfo.start(args, args.json)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rank-memory-") as tmp:
        for repeat in range(args.repeats):
            for dataset in args.datasets:
                rows.append({**_row(dataset, train(dataset, args, Path(tmp))), "repeat": repeat + 1})
                if not args.json:
                    print(rows[-1], flush=True)
                if any(rows[-1].get("kernels_compiled") or []):
                    print(f"warning: the ranks on {Path(dataset).name} compiled {rows[-1]['kernels_compiled']} kernel "
                          "specialisation(s): their private memory includes the compiler's; run `graphstore warmup` "
                          "(or this tool once) first", file=sys.stderr, flush=True)
    _ratios(rows, args.datasets[0])
    out.update(rows=rows)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        cols = ["nodes", "edges", "repeat", "steps", "epoch_seconds", "peak_rss_mb", "peak_rss_ratio", "dataset_pages_mb",
                "private_peak_mb", "private_peak_ratio", "heap_mb", "kernels_compiled"]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r.get(c, r.get("failed", ""))) for c in cols) + " |")
    benchinfo.record("bench_rank_memory", args, out, {"datasets": [Path(d).name for d in args.datasets],
                                                      "ranks": args.ranks, "batch_size": args.batch_size,
                                                      "unmapped": args.unmapped})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
