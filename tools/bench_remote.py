"""Benchmark reads of a remote dataset through the chunk cache, cold and warm, against RAM and local disk.

Usage::

    python tools/bench_remote.py [--json] [--nodes N] [--features F] [--chunk-mb MB] [--latency-ms 20]
                                 [--concurrency 16] [--repeats 3] [--seed S] [--data DIR]

It ingests (once, cached under --data) a synthetic graph whose feature array ``x`` spans hundreds of
chunks, and serves it through a :class:`~graphstore.storage.local.LocationWrapper` that adds
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

Every cold gather draws fresh IDs (from a fresh 5% window for the local case) on an empty cache; every
warm call draws fresh IDs from the rows the last cold gather cached (``--seed`` to draw them again).
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
from graphstore.storage.local import LocationWrapper, open_location

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

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


def _median_seconds(fn, id_sets: list, warmup: bool = True) -> float:
    """Median seconds of ``fn(ids)``, one call per ID set (a fresh set each call)."""
    if warmup:
        fn(id_sets[0])
    times = []
    for ids in id_sets:
        start = time.perf_counter()
        fn(ids)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _paired_seconds(fn_a, fn_b, id_sets: list) -> tuple[float, float]:
    """Median seconds of two functions timed alternately on the same fresh ID set each round (so drift
    and noise hit both alike, and neither re-reads rows the CPU cache still holds from the last round)."""
    fn_a(id_sets[0]), fn_b(id_sets[0])
    times_a, times_b = [], []
    for ids in id_sets[1:]:
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            start = time.perf_counter()
            fn(ids)
            times.append(time.perf_counter() - start)
    return float(np.median(times_a)), float(np.median(times_b))


def _dataset(data: Path, nodes: int, features: int, chunk_mb: float) -> graphstore.Dataset:
    try:
        return graphstore.open_dataset(data)
    except DatasetNotFoundError:
        spec = f"synthetic:nodes={nodes},avg_degree=4,features={features},classes=8,seed=0"
        print(f"ingesting {spec} into {data} (once)", file=sys.stderr)
        graphstore.ingest(spec, data, num_parts=2, method="range", chunk_mb=chunk_mb, parents=True)
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


def _warm_timings(ds: graphstore.Dataset, fs_local, draw, partial: bool, repeats: int) -> dict:
    """Seconds of a new copy of ``ds`` over the filled cache, of ``ds`` before and after every chunk is
    mapped; ``draw(i)`` gives the i-th fresh ID set (rows the cold runs cached, so no request is made)."""
    gather = lambda fs: lambda ids: fs[None, "x", ids]  # noqa: E731
    reopen = _median_seconds(lambda ids: pickle.loads(pickle.dumps(ds)).partition(0)[0][None, "x", ids],
                             [draw(i) for i in range(repeats)], warmup=False)
    fs = ds.partition(0)[0]
    sets = [draw(1000 + i) for i in range(201)]
    t_partial = _paired_seconds(gather(fs_local), gather(fs), sets)[1] if partial else None
    fs[None, "x", None]  # every chunk mapped: the steady state
    assert torch.equal(fs[None, "x", sets[0]], fs_local[None, "x", sets[0]])  # same rows, or timing means nothing
    t_local, t_warm = _paired_seconds(gather(fs_local), gather(fs), [draw(2000 + i) for i in range(201)])
    return {"reopen": reopen, "partial": t_partial, "local": t_local, "warm": t_warm}


def bench_batch(local: graphstore.Dataset, x_ram: np.ndarray, batch: int, spread: float, args: argparse.Namespace,
                cache: Path) -> dict:
    """Cold gathers (each on an empty cache, each with fresh IDs from a fresh window of ``spread`` of the
    range), then warm ones with fresh IDs per call drawn from the rows the last cold gather cached."""
    fs_local, gs = local.partition(0)
    lo, hi = gs.dst_range()
    info = local.manifest.arrays[X]
    width = int(spread * (hi - lo))

    def draw_cold(r: int) -> torch.Tensor:
        g = benchinfo.rng(args.seed, batch, int(spread * 100), r)
        start = lo + int(g.integers(0, hi - lo - width + 1))
        return torch.from_numpy(g.integers(start, start + width, batch))

    colds = []
    for r in range(args.repeats):
        ids = draw_cold(r)
        colds.append({**_cold(local, ids, args, cache), "ids": ids,
                      "touched": len(np.unique((ids.numpy() - lo) // info.chunk_rows))})
    cached = np.unique((colds[-1]["ids"].numpy() - lo) // info.chunk_rows)  # chunks the last cold run cached
    pool = (cached[:, None] * info.chunk_rows + np.arange(info.chunk_rows)).ravel()
    pool = pool[pool < hi - lo] + lo

    def draw_warm(i: int) -> torch.Tensor:
        return torch.from_numpy(benchinfo.rng(args.seed, batch, int(spread * 100), 10**6, i).choice(pool, batch))

    t = _warm_timings(colds[-1]["dataset"], fs_local, draw_warm, len(cached) < info.num_chunks, args.repeats)
    t_ram = _median_seconds(lambda rows: x_ram[rows], [draw_warm(3000 + i).numpy() - lo for i in range(50)])
    t_cold = float(np.median([c["seconds"] for c in colds]))
    touched = int(np.median([c["touched"] for c in colds]))
    ideal = float(np.median([math.ceil(c["touched"] / args.concurrency) for c in colds])) * args.latency_ms / 1e3
    io = colds[-1]["io"]
    ms = {f"{name}_ms": None if value is None else 1e3 * value for name, value in t.items()}
    return {"batch": batch, "id_range_share": spread, "chunks_touched": touched,
            "chunks_touched_last": colds[-1]["touched"], "cold_requests": io["requests"],
            "cold_bytes": io["bytes"], "ram_ms": 1e3 * t_ram, "cold_ms": 1e3 * t_cold, "ideal_cold_ms": 1e3 * ideal,
            **ms, "cold_vs_ideal": t_cold / ideal, "warm_vs_local": t["warm"] / t["local"],
            "local_vs_ram": t["local"] / t_ram}


def _print(result: dict) -> None:
    s = result["setup"]
    print(f"x: {s['rows']:,} rows x {s['features']} float32 in {s['chunks']} chunks of {s['chunk_bytes'] / 1e6:.2f} MB;"
          f" latency {s['latency_ms']} ms per request, concurrency {s['concurrency']}")
    for r in result["gathers"]:
        where = "random IDs" if r["id_range_share"] == 1 else f"IDs from {r['id_range_share']:.0%} of the range"
        print(f"  batch {r['batch']:>6,} ({where}): touches {r['chunks_touched']} chunks (median); cold "
              f"{r['cold_ms']:7.1f} ms (last run: {r['cold_requests']} requests for {r['chunks_touched_last']} chunks, {r['cold_bytes'] / 1e6:.1f} MB; ideal {r['ideal_cold_ms']:.0f} ms, "
              f"ratio {r['cold_vs_ideal']:.2f})")
        print(f"                 reopen over the cache {r['reopen_ms']:7.1f} ms (0 requests); "
              f"warm {r['warm_ms']:.3f} ms vs local disk {r['local_ms']:.3f} ms (ratio {r['warm_vs_local']:.2f}) "
              f"vs RAM {r['ram_ms']:.3f} ms")
        if r["partial_ms"] is not None:
            print(f"                 before every chunk is mapped (its rows cached): {r['partial_ms']:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=toolargs.count, default=500_000)
    parser.add_argument("--features", type=toolargs.count, default=64)
    parser.add_argument("--chunk-mb", type=toolargs.positive, default=0.25)
    parser.add_argument("--latency-ms", type=toolargs.positive, default=20.0)
    parser.add_argument("--concurrency", type=toolargs.count, default=16)
    parser.add_argument("--repeats", type=toolargs.count, default=3)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "remote")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    run_info = benchinfo.start(args, args.json)
    local = _dataset(args.data / f"n{args.nodes}_f{args.features}_c{args.chunk_mb}", args.nodes, args.features,
                     args.chunk_mb)
    x_ram = np.array(local.partition(0)[0][None, "x", None].numpy())
    info = local.manifest.arrays[X]
    with tempfile.TemporaryDirectory(prefix="graphstore-bench-cache-") as cache:
        gathers = [bench_batch(local, x_ram, b, spread, args, Path(cache) / "c") for b, spread in BATCHES]
    setup = {"rows": info.shape[0], "features": info.shape[1], "chunks": info.num_chunks,
             "chunk_bytes": info.chunk_rows * info.shape[1] * 4, "latency_ms": args.latency_ms,
             "concurrency": args.concurrency}
    result = {**run_info, "setup": setup, "gathers": gathers}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    benchinfo.record("bench_remote", args, result,
                     {"nodes": args.nodes, "features": args.features, "latency_ms": args.latency_ms})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
