"""Benchmark ingest in-process (``--engine local``) vs on a Dask LocalCluster, on the same graph in one run.

Prints, per graph and engine: seconds, peak RSS of the whole process tree and the edge cut. Each run is
a fresh child process (what a user's ``graphstore ingest`` is), so no run inherits another's heap; its
tree (the child, and for Dask the scheduler thread in it and every nanny and worker process) is sampled
with psutil every 0.2 s from here.

    .venv/bin/python tools/bench_ingest.py --graphs synthetic:nodes=1500000,avg_degree=20 \\
        synthetic:nodes=3000000,avg_degree=20 --parts 4 --workers 2 --memory-limit 4GB
"""

from __future__ import annotations

import argparse
import json
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

GRAPHS = ["synthetic:nodes=1500000,avg_degree=20", "synthetic:nodes=3000000,avg_degree=20"]


class TreeRSS:
    """Peak summed RSS of one process and all its descendants, sampled on a thread."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root, self.every, self.peak, self._stop = psutil.Process(pid), every, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            return 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total

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
    if engine == "local":
        summary = graphstore.ingest(spec, dest, num_parts=parts, method=method, seed=seed)
    else:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory_limit,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            summary = graphstore.ingest(spec, dest, num_parts=parts, method=method, seed=seed, engine="dask",
                                        client=client)
    return {"seconds": round(time.perf_counter() - started, 1), "edge_cut_fraction": summary.edge_cut_fraction,
            "edges": sum(summary.edges_per_part)}


def run_one(spec: str, engine: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """One ingest in a fresh child process, its process tree's RSS sampled from here."""
    dest = f"{root}/{engine}"
    job = json.dumps([spec, engine, dest, args.parts, args.method, args.seed, args.workers, args.memory_limit])
    child = subprocess.Popen([sys.executable, __file__, "--child", job], stdout=subprocess.PIPE, text=True)
    with TreeRSS(child.pid) as rss:
        out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the {engine} ingest of {spec} failed (exit {child.returncode}); its error is above")
    result = json.loads(out.strip().splitlines()[-1])
    verified = _verify(dest) if args.verify else None
    shutil.rmtree(dest, ignore_errors=True)
    return {"graph": spec, "engine": engine, **result, "peak_rss_gb": round(rss.peak / 1e9, 2), "verify": verified}


def _verify(dest: str) -> str:
    """``graphstore verify DEST`` (every chunk's checksum) in a child process: opening a dataset loads
    torch, which would then count in this process's RSS for the runs after it."""
    done = subprocess.run([sys.executable, "-c", "import sys; from graphstore.cli.app import main; "
                           "raise SystemExit(main(['verify', sys.argv[1]]))", dest], capture_output=True, text=True)
    return "ok" if done.returncode == 0 else f"failed: {(done.stdout + done.stderr).strip()[-300:]}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one run, in the child process run_one started
        print(json.dumps(ingest_once(*json.loads(argv[1]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=GRAPHS)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--method", default="metis")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="4GB")
    parser.add_argument("--engines", default="local,dask", help="comma-separated, in run order (default local,dask)")
    parser.add_argument("--verify", action="store_true", help="run graphstore verify on each result (not timed)")
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    header = benchinfo.start(args, args.json)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as root:
        for spec in args.graphs:
            for engine in args.engines.split(","):
                rows.append(run_one(spec, engine, args, root))
                if not args.json:
                    r = rows[-1]
                    print(f"| {spec} | {engine} | {r['edges']:,} | {r['seconds']} | {r['peak_rss_gb']} | "
                          f"{r['edge_cut_fraction']:.4f} | {r['verify'] or ''} |", flush=True)
    if args.json:
        print(json.dumps({**header, "rows": rows}, indent=2))
    benchinfo.record("bench_ingest", args, {**header, "rows": rows},
                     {"graphs": args.graphs, "parts": args.parts, "memory_limit": args.memory_limit})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
