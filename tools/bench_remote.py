"""Benchmark reads of a remote dataset through the chunk cache, cold and warm, against RAM and local disk.

Usage::

    python tools/bench_remote.py [--json] [--nodes N] [--features F] [--chunk-mb MB] [--latency-ms 20]
                                 [--concurrency 16] [--repeats 3] [--data DIR]

It ingests (once, cached under --data) a synthetic graph whose feature array ``x`` spans hundreds of
chunks, and serves it through a :class:`~graphstore.storage.LocationWrapper` that adds
``--latency-ms`` to every request (object-storage latency, simulated in-process; bytes come from local
disk). For batches of own node IDs (uniformly random, and drawn from a 5% window as a local
neighborhood would be) it measures, in one run:

- ``ram``: ``x_in_ram[ids]`` on an in-RAM copy (the floor);
- ``local``: ``feature_store[None, "x", ids]`` on the same dataset opened from local disk (page cache warm);
- ``cold``: the same gather on the remote dataset with an empty cache: it touches K chunks and fetches
  them ``--concurrency`` at a time, so the ideal is ``ceil(K / concurrency) x latency``;
- ``reopen``: a new process-like copy of the dataset over the filled cache (no requests: verify + map);
- ``partial``: its rows cached but not yet every chunk of ``x`` (reads check which chunks are mapped);
- ``warm``: the remote dataset once every chunk is mapped (the steady state of epoch 2+).

It prints requests, bytes and milliseconds per gather and the ratios ``cold / ideal`` (goal <= 2) and
``warm / local`` (goal <= 1.1).
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import graphstore
from graphstore.errors import DatasetNotFoundError
from graphstore.storage import LocationWrapper, open_location

BATCHES = ((1024, 1.0), (10_000, 1.0), (1024, 0.05))  # (batch size, share of the partition's ID range drawn from)


class SlowLocation(LocationWrapper):
    """Local bytes with object-store latency: every request waits ``latency`` seconds first."""

    def __init__(self, inner, latency: float) -> None:
        super().__init__(inner)
        self.latency = latency

    def read_bytes(self, key):
        time.sleep(self.latency)
        return super().read_bytes(key)

    def download(self, key, dest, on_retry=None):
        time.sleep(self.latency)
        return super().download(key, dest, on_retry)


def _median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _paired_seconds(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Median seconds of two functions timed alternately (so drift and noise hit both alike)."""
    fn_a(), fn_b()
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return float(np.median(times_a)), float(np.median(times_b))


def _dataset(data: Path, nodes: int, features: int, chunk_mb: float) -> graphstore.Dataset:
    try:
        return graphstore.open_dataset(data)
    except DatasetNotFoundError:
        spec = f"synthetic:nodes={nodes},avg_degree=4,features={features},classes=8,seed=0"
        print(f"ingesting {spec} into {data} (once)", file=sys.stderr)
        graphstore.ingest(spec, data, num_parts=2, method="range", chunk_mb=chunk_mb)
        return graphstore.open_dataset(data)


def _cold(local: graphstore.Dataset, ids: torch.Tensor, args: argparse.Namespace, cache: Path) -> dict:
    """One gather on an empty cache; returns its time and I/O counters (and leaves the cache filled)."""
    shutil.rmtree(cache, ignore_errors=True)
    location = SlowLocation(open_location(local.url), args.latency_ms / 1e3)
    ds = graphstore.open_dataset(location, cache_dir=cache, concurrency=args.concurrency)
    fs = ds.partition(0)[0]
    ds.reset_io_stats()
    start = time.perf_counter()
    fs[None, "x", ids]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "io": ds.io_stats(), "dataset": ds}


X = "part_00000/nodes/_N/x"


def _warm_timings(ds: graphstore.Dataset, fs_local, ids: torch.Tensor, partial: bool, repeats: int) -> dict:
    """Seconds of a new copy of ``ds`` over the filled cache, of ``ds`` before and after every chunk is mapped."""
    reopen = _median_seconds(lambda: pickle.loads(pickle.dumps(ds)).partition(0)[0][None, "x", ids], repeats,
                             warmup=False)
    fs = ds.partition(0)[0]
    t_partial = _paired_seconds(lambda: fs_local[None, "x", ids], lambda: fs[None, "x", ids], 200)[1] if partial \
        else None
    fs[None, "x", None]  # every chunk mapped: the steady state
    assert torch.equal(fs[None, "x", ids], fs_local[None, "x", ids])  # same rows, or the timing means nothing
    t_local, t_warm = _paired_seconds(lambda: fs_local[None, "x", ids], lambda: fs[None, "x", ids], 200)
    return {"reopen": reopen, "partial": t_partial, "local": t_local, "warm": t_warm}


def bench_batch(local: graphstore.Dataset, x_ram: np.ndarray, batch: int, spread: float, args: argparse.Namespace,
                cache: Path) -> dict:
    fs_local, gs = local.partition(0)
    lo, hi = gs.dst_range()
    ids = torch.from_numpy(np.random.default_rng(batch).integers(lo, lo + int(spread * (hi - lo)), batch))
    rows, info = ids.numpy() - lo, local.manifest.arrays[X]
    touched = len(np.unique(rows // info.chunk_rows))
    colds = [_cold(local, ids, args, cache) for _ in range(args.repeats)]
    t = _warm_timings(colds[-1]["dataset"], fs_local, ids, touched < info.num_chunks, args.repeats)
    t_ram = _median_seconds(lambda: x_ram[rows], 50)
    t_cold = float(np.median([c["seconds"] for c in colds]))
    ideal = math.ceil(touched / args.concurrency) * args.latency_ms / 1e3
    io = colds[-1]["io"]
    ms = {f"{name}_ms": None if value is None else 1e3 * value for name, value in t.items()}
    return {"batch": batch, "id_range_share": spread, "chunks_touched": touched, "cold_requests": io["requests"],
            "cold_bytes": io["bytes"], "ram_ms": 1e3 * t_ram, "cold_ms": 1e3 * t_cold, "ideal_cold_ms": 1e3 * ideal,
            **ms, "cold_vs_ideal": t_cold / ideal, "warm_vs_local": t["warm"] / t["local"],
            "local_vs_ram": t["local"] / t_ram}


def _print(result: dict) -> None:
    s = result["setup"]
    print(f"x: {s['rows']:,} rows x {s['features']} float32 in {s['chunks']} chunks of {s['chunk_bytes'] / 1e6:.2f} MB;"
          f" latency {s['latency_ms']} ms per request, concurrency {s['concurrency']}")
    for r in result["gathers"]:
        where = "random IDs" if r["id_range_share"] == 1 else f"IDs from {r['id_range_share']:.0%} of the range"
        print(f"  batch {r['batch']:>6,} ({where}): touches {r['chunks_touched']} chunks; cold {r['cold_ms']:7.1f} ms "
              f"({r['cold_requests']} requests, {r['cold_bytes'] / 1e6:.1f} MB; ideal {r['ideal_cold_ms']:.0f} ms, "
              f"ratio {r['cold_vs_ideal']:.2f})")
        print(f"                 reopen over the cache {r['reopen_ms']:7.1f} ms (0 requests); "
              f"warm {r['warm_ms']:.3f} ms vs local disk {r['local_ms']:.3f} ms (ratio {r['warm_vs_local']:.2f}) "
              f"vs RAM {r['ram_ms']:.3f} ms")
        if r["partial_ms"] is not None:
            print(f"                 before every chunk is mapped (its rows cached): {r['partial_ms']:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=500_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--chunk-mb", type=float, default=0.25)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "remote")
    args = parser.parse_args(argv)
    local = _dataset(args.data / f"n{args.nodes}_f{args.features}_c{args.chunk_mb}", args.nodes, args.features,
                     args.chunk_mb)
    x_ram = np.array(local.partition(0)[0][None, "x", None].numpy())
    info = local.manifest.arrays[X]
    with tempfile.TemporaryDirectory(prefix="graphstore-bench-cache-") as cache:
        gathers = [bench_batch(local, x_ram, b, spread, args, Path(cache) / "c") for b, spread in BATCHES]
    setup = {"rows": info.shape[0], "features": info.shape[1], "chunks": info.num_chunks,
             "chunk_bytes": info.chunk_rows * info.shape[1] * 4, "latency_ms": args.latency_ms,
             "concurrency": args.concurrency}
    result = {"setup": setup, "gathers": gathers}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
