"""Benchmark ingest in-process (``--engine local``) vs on a Dask LocalCluster, on the same graphs in one run.

Prints, per graph and engine: seconds, CPU seconds of the whole process tree (what the ingest costs in
worker time), peak RSS of the whole tree (and that peak over the first graph's, for the same engine), the
largest client and worker process peaks, bytes the dataset takes on disk (in all, per node, per edge) and
the edge cut. Each run is a fresh child process (what a user's ``graphstore ingest`` is), so no run inherits
another's heap; its tree (the child, and for Dask the scheduler thread in it and every worker process) is
sampled with psutil every 0.2 s from here, and its CPU time is that of every process of the tree once reaped.

    .venv/bin/python tools/bench_ingest.py --graphs synthetic:nodes=1500000,avg_degree=20 \\
        synthetic:nodes=3000000,avg_degree=20 --parts 4 --workers 2 --memory-limit 4GB

Datasets are written to a temporary folder and deleted after each run, or kept under ``--keep DIR`` (one
folder per graph and engine, replaced when it exists).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import graphstore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

GRAPHS = ["synthetic:nodes=1500000,avg_degree=20", "synthetic:nodes=3000000,avg_degree=20"]


class TreeRSS:
    """Peak summed RSS of one process and all its descendants, sampled on a thread; and each process's peak."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root, self.every, self.peak, self._stop = psutil.Process(pid), every, 0, threading.Event()
        self.peaks: dict[int, int] = {}  # pid -> its own peak RSS
        self.roles: dict[int, str] = {}  # pid -> "client", "worker" or "other"
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _role(self, proc: psutil.Process) -> str:
        if proc.pid == self.root.pid:
            return "client"
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            return "other"
        return "other" if "resource_tracker" in command or "forkserver" in command else "worker"

    def _sample(self) -> int:
        total = 0
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            return 0
        for proc in procs:
            try:
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            if proc.pid not in self.roles:
                self.roles[proc.pid] = self._role(proc)
            self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), rss)
        return total

    def role_peak(self, role: str) -> int:
        """The largest peak of one process of ``role`` (0 when there was none)."""
        return max((peak for pid, peak in self.peaks.items() if self.roles.get(pid) == role), default=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.every)

    def __enter__(self) -> TreeRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ingest_once(spec: str, engine: str, dest: str, parts: int, method: str, seed: int, workers: int,
                memory_limit: str) -> dict[str, Any]:
    """One ingest of ``spec`` on ``engine`` in this process, cluster start-up and shutdown included for Dask."""
    started = time.perf_counter()
    options = dict(num_parts=parts, method=method, seed=seed, overwrite=True, parents=True)
    if engine == "local":
        summary = graphstore.ingest(spec, dest, **options)
    else:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory_limit,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            summary = graphstore.ingest(spec, dest, engine="dask", client=client, **options)
    return {"seconds": round(time.perf_counter() - started, 1), "edge_cut_fraction": summary.edge_cut_fraction,
            "nodes": sum(summary.nodes_per_part), "edges": sum(summary.edges_per_part)}


def _children_cpu() -> float:
    """User + system CPU seconds of every reaped descendant of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def disk_bytes(path: str) -> dict[str, int]:
    """Bytes of every file under ``path`` (their sizes: what a copy of the dataset takes), in all and those of
    the edge arrays (``part_*/edges/``) and of the node arrays (``part_*/nodes/`` and ``part_*/halo/``)."""
    out = {"total": 0, "edges": 0, "nodes": 0}
    for root, _, files in os.walk(path):
        kind = next((k for k, part in (("edges", "edges"), ("nodes", "nodes"), ("nodes", "halo"))
                     if part in os.path.relpath(root, path).split(os.sep)[1:2]), None)
        size = sum(os.path.getsize(os.path.join(root, name)) for name in files)
        out["total"] += size
        if kind is not None:
            out[kind] += size
    return out


def run_one(spec: str, engine: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """One ingest in a fresh child process, its process tree's RSS sampled from here."""
    dest = f"{root}/{engine}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', spec.split(':', 1)[-1])}"
    job = json.dumps([spec, engine, dest, args.parts, args.method, args.seed, args.workers, args.memory_limit])
    cpu = _children_cpu()
    child = subprocess.Popen([sys.executable, __file__, "--child", job], stdout=subprocess.PIPE, text=True)
    with TreeRSS(child.pid) as rss:
        out, _ = child.communicate()
    cpu = _children_cpu() - cpu  # the child and every worker it reaped
    if child.returncode != 0:
        raise SystemExit(f"the {engine} ingest of {spec} failed (exit {child.returncode}); its error is above")
    result = json.loads(out.strip().splitlines()[-1])
    size = disk_bytes(dest)
    verified = _verify(dest) if args.verify else None
    if args.keep is None:
        shutil.rmtree(dest, ignore_errors=True)
    return {"graph": spec, "engine": engine, "nodes": result["nodes"], "edges": result["edges"],
            "seconds": result["seconds"], "cpu_seconds": round(cpu, 1), "peak_rss_gb": round(rss.peak / 1e9, 3),
            "client_peak_gb": round(rss.role_peak("client") / 1e9, 3),
            "worker_peak_gb": round(rss.role_peak("worker") / 1e9, 3) if engine == "dask" else None,
            "disk_gb": round(size["total"] / 1e9, 3),
            "disk_bytes_per_node": round(size["total"] / max(result["nodes"], 1), 1),
            "disk_bytes_per_edge": round(size["total"] / max(result["edges"], 1), 2),
            "node_array_bytes_per_node": round(size["nodes"] / max(result["nodes"], 1), 1),
            "edge_array_bytes_per_edge": round(size["edges"] / max(result["edges"], 1), 2),
            "edge_cut_fraction": result["edge_cut_fraction"], "verify": verified}


def _verify(dest: str) -> str:
    """``graphstore verify DEST`` (every chunk's checksum) in a child process: opening a dataset loads
    torch, which would then count in this process's RSS for the runs after it."""
    done = subprocess.run([sys.executable, "-c", "import sys; from graphstore.cli.app import main; "
                           "raise SystemExit(main(['verify', sys.argv[1]]))", dest], capture_output=True, text=True)
    return "ok" if done.returncode == 0 else f"failed: {(done.stdout + done.stderr).strip()[-300:]}"


def _relative(rows: list[dict[str, Any]]) -> None:
    """Each row's peak over the first graph's peak on the same engine, and seconds per million edges."""
    first: dict[str, float] = {}
    for row in rows:
        first.setdefault(row["engine"], row["peak_rss_gb"])
        row["peak_vs_first"] = round(row["peak_rss_gb"] / first[row["engine"]], 3)
        row["seconds_per_m_edges"] = round(row["seconds"] / (row["edges"] / 1e6), 3)


NOTES = ["peak_rss_gb: the most the whole process tree (client with the Dask scheduler in it, and every worker) "
         "held at once, sampled every 0.2 s; client/worker_peak_gb: the largest single process; cpu_seconds: user "
         "+ system CPU of the whole tree; disk: the files of the dataset written, in all over its nodes and its edges, "
         "and its node arrays (with the halos) over its nodes and its edge arrays over its edges",
         "Dask: a LocalCluster of one-thread workers on the same machine, start-up and shutdown included"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one run, in the child process run_one started
        print(json.dumps(ingest_once(*json.loads(argv[1]))), flush=True)
        return 0
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=GRAPHS)
    parser.add_argument("--parts", type=toolargs.count, default=4)
    parser.add_argument("--method", default="metis")
    parser.add_argument("--workers", type=toolargs.count, default=2)
    parser.add_argument("--memory-limit", type=toolargs.size, default="4GB")
    parser.add_argument("--engines", default="local,dask", help="comma-separated, in run order (default local,dask)")
    parser.add_argument("--verify", action="store_true", help="run graphstore verify on each result (not timed)")
    parser.add_argument("--keep", metavar="DIR", help="write the datasets under DIR and keep them (default: a "
                        "temporary folder, each dataset deleted after its run)")
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    header = benchinfo.start(args, args.json)
    rows = []
    if not args.json:
        print("| graph | engine | edges | seconds | CPU seconds | peak RSS, tree (GB) | client peak | worker peak | "
              "disk (GB) | disk B/node | disk B/edge | edge cut | verify |\n" + "|---" * 13 + "|", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = os.path.abspath(args.keep) if args.keep is not None else tmp
        for spec in args.graphs:
            for engine in args.engines.split(","):
                rows.append(run_one(spec, engine, args, root))
                if not args.json:
                    r = rows[-1]
                    print(f"| {spec} | {engine} | {r['edges']:,} | {r['seconds']} | {r['cpu_seconds']} | "
                          f"{r['peak_rss_gb']} | {r['client_peak_gb']} | {r['worker_peak_gb'] or ''} | {r['disk_gb']} | "
                          f"{r['disk_bytes_per_node']} | {r['disk_bytes_per_edge']} | {r['edge_cut_fraction']:.4f} | "
                          f"{r['verify'] or ''} |", flush=True)
    _relative(rows)
    result = {**header, "rows": rows, "notes": NOTES}
    if args.keep is not None:
        result["kept_in"] = os.path.abspath(args.keep)  # one folder per run: <engine>-<graph spec>
    if args.json:
        print(json.dumps(result, indent=2))
    elif len(rows) > 1:
        print("peak over the first graph's: " + ", ".join(f"{r['engine']} {r['edges']:,} edges {r['peak_vs_first']}"
                                                          for r in rows))
    benchinfo.record("bench_ingest", args, result,
                     {"graphs": args.graphs, "parts": args.parts, "memory_limit": args.memory_limit,
                      "engines": args.engines})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
