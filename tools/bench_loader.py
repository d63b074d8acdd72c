"""Benchmark loader threads: one rank's batches/s with 1, 2 and 3 loader threads, on the same batches.

Usage::

    python tools/bench_loader.py [--json] [--threads 1,2,3] [--repeats 3] [--batches 30] [--train]

The graph (``SPEC``, a 200k-node synthetic graph) is ingested once into one partition under
``bench-out/loader/`` and reused. The loader is graphstore-train's: ``DistributedNeighborLoader`` of
rank 0 of 1 (``--loader in-process``: ``sampling.NeighborLoader``), fanout 15,10,5, batch 1,024,
``seed=0``, prefetch 1. In one process, each repeat runs one pass per thread count in turn
(interleaved, so a drift of the machine hits every count alike) over the same seed nodes and the same
sampler pass, so every count must give the same batches: each batch's ``n_id`` and ``edge_index`` are
hashed (after the timed pass) and compared; the exit code is 1 if they differ. Prints batches/s per
thread count (median over repeats), the ratio to 1 thread (median of the per-repeat ratios), and the
load average before and after (a figure taken while other work runs is not worth keeping).

The benchmark runs under the allocator graphstore-train gives its ranks (jemalloc where the machine
has it, ``GRAPHSTORE_MALLOC``: it re-executes itself with the preload) and prints which.

``--train`` also runs ``graphstore-train DATA --loader-only --nproc 1 --loader-threads N`` for each
count (its own per-rank batches/s, over the training seeds, two epochs: the second is reported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import graphstore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPEC = "synthetic:nodes=200000,avg_degree=10,features=128,classes=8,seed=0"
FANOUT = [15, 10, 5]


def _loader(ds: Any, kind: str, seeds: torch.Tensor, threads: int, batch_size: int, prefetch: int) -> Any:
    options = dict(batch_size=batch_size, seed=0, loader_threads=threads, prefetch=prefetch)
    if kind == "in-process":
        from sampling import NeighborLoader

        return NeighborLoader(ds, FANOUT, input_nodes=seeds, **options)
    from sampling.dist_loader import DistributedNeighborLoader
    from sampling.distributed import PartitionServer
    from sampling.transport import LoopbackTransport

    (transport,) = LoopbackTransport.group(1)
    PartitionServer(ds, 0).register(transport)
    return DistributedNeighborLoader(ds, FANOUT, transport, seeds, filter_per_worker=False, edge_ids=False, **options)


def _pass(loader: Any) -> tuple[float, list[str]]:
    """(batches/s, a digest of each batch) of one pass; the digests are taken after the clock stops."""
    sampler = loader.node_sampler
    sampler.set_epoch(0)  # every pass is the same pass (its streams): the batches must not depend on threads
    kept = []
    start = time.perf_counter()
    for batch in loader:
        kept.append((batch.n_id, batch.edge_index))  # the features go: a pass keeps no 100 MB batches
        del batch
    seconds = time.perf_counter() - start
    digests = [hashlib.blake2b(n_id.numpy().tobytes() + edges.numpy().tobytes(), digest_size=8).hexdigest()
               for n_id, edges in kept]
    return len(kept) / seconds, digests


def run(args: argparse.Namespace) -> dict[str, Any]:
    dest = benchinfo.ingested(args.data, SPEC, 1)
    ds = graphstore.open_dataset(dest)
    n = ds.num_nodes()
    seeds = torch.from_numpy(benchinfo.rng(args.seed, 0).permutation(n)[: args.batches * args.batch_size])
    counts = [int(t) for t in args.threads.split(",")]
    loaders = {t: _loader(ds, args.loader, seeds, t, args.batch_size, args.prefetch) for t in counts}
    _pass(loaders[counts[0]])  # warm-up: kernels loaded, pages mapped, the heap grown
    rates: dict[int, list[float]] = {t: [] for t in counts}
    digests: dict[int, list[str]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for t in counts:
            rate, digest = _pass(loaders[t])
            rates[t].append(rate)
            if digests.setdefault(t, digest) != digest:
                digests[t] = ["differs from pass to pass"]
    base = counts[0]
    out = {"spec": SPEC, "loader": args.loader, "fanout": FANOUT, "batch_size": args.batch_size,
           "batches_per_pass": args.batches, "repeats": args.repeats, "prefetch": args.prefetch,
           "load_average_1min_before": round(load_before, 2), "load_average_1min_after": round(os.getloadavg()[0], 2),
           "batches_per_s": {t: [round(r, 3) for r in rates[t]] for t in counts},
           "median_batches_per_s": {t: round(statistics.median(rates[t]), 3) for t in counts},
           "ratio_to_1_thread": {t: round(statistics.median(a / b for a, b in zip(rates[t], rates[base])), 3)
                                 for t in counts},
           "same_batches": all(digests[t] == digests[base] for t in counts)}
    if args.train:
        out["graphstore_train"] = {t: _train(dest, t, args) for t in counts}
    return out


def _train(dest: Path, threads: int, args: argparse.Namespace) -> Any:
    """``graphstore-train --loader-only`` with ``threads`` loader threads: the last epoch's batches/s of rank 0."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "training.launch", str(dest), "--loader-only", "--nproc", "1",
               "--loader-threads", str(threads), "--fanout", ",".join(map(str, FANOUT)),
               "--batch-size", str(args.batch_size), "--epochs", "2", "--no-progress", "--metrics-out", str(metrics)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            return {"error": done.stderr[-2000:], "command": " ".join(cmd)}
        epochs = json.loads(metrics.read_text())["epochs"]
        return {"loader_batches_per_s": epochs[-1]["loader_batches_per_s"], "command": " ".join(cmd)}


def _under_ranks_allocator(argv: list[str] | None) -> None:
    """Re-execute this script under the allocator graphstore-train preloads for its ranks, once."""
    from training import allocator

    env = allocator.preload_env(dict(os.environ))
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and "GRAPHSTORE_BENCH_REEXEC" not in os.environ:
        args = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, __file__, *args], {**env, "GRAPHSTORE_BENCH_REEXEC": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--data", type=Path, default=ROOT / "bench-out" / "loader", help="where the graph is ingested")
    parser.add_argument("--loader", choices=("distributed", "in-process"), default="distributed")
    parser.add_argument("--threads", type=toolargs.counts, default="1,2,3",
                        help="loader thread counts, the first is the baseline")
    parser.add_argument("--batches", type=toolargs.count, default=30, help="batches per pass")
    parser.add_argument("--repeats", type=toolargs.count, default=3, help="interleaved passes per thread count")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--prefetch", type=toolargs.integer(0), default=1,
                        help="batches ready ahead (graphstore-train's: 1)")
    parser.add_argument("--train", action="store_true", help="also measure through graphstore-train --loader-only")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)  # a bad flag is refused before the re-execution
    _under_ranks_allocator(argv)
    info = benchinfo.start(args, args.json)
    from training import allocator

    result = run(args)
    out = {**info, "allocator": allocator.name(), **result}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['spec']}, 1 partition; {args.loader} loader, fanout {FANOUT}, batch {args.batch_size}, "
              f"{args.batches} batches a pass, {args.repeats} interleaved repeats, prefetch {args.prefetch}; "
              f"allocator {out['allocator']}")
        for t, rate in out["median_batches_per_s"].items():
            print(f"  {t} loader thread(s): {rate:7.2f} batches/s  ({out['ratio_to_1_thread'][t]:.2f}x 1 thread; "
                  f"passes {out['batches_per_s'][t]})")
        print(f"  same batches for every thread count: {out['same_batches']}; load average "
              f"{out['load_average_1min_before']} before the timed passes, {out['load_average_1min_after']} after")
        for t, result in out.get("graphstore_train", {}).items():
            print(f"  graphstore-train --loader-only --loader-threads {t}: {result}")
    benchinfo.record("bench_loader", args, out,
                     {"spec": out["spec"], "loader": args.loader, "batch_size": args.batch_size})
    return 0 if out["same_batches"] else 1


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
