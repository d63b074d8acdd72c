"""Benchmark loader threads and sampler processes: one rank's batches/s, alone and beside a stand-in training step.

Usage::

    python tools/bench_loader.py [--json] [--threads 1,2,p1,p2,s2] [--repeats 3] [--batches 30] [--step-ms 6] [--train]

The graph (``SPEC``, a 200k-node synthetic graph) is ingested once into one partition under
``bench-out/loader/`` and reused. The loader is graphstore-train's: ``DistributedNeighborLoader`` of
rank 0 of 1 (``--loader in-process``: ``sampling.NeighborLoader``), fanout 15,10,5, batch 1,024,
``seed=0``, prefetch 1. ``--threads`` lists the ways batches are built: ``N`` loader threads in the
rank, ``pN`` N sampler processes beside it (``num_workers=N``; distributed loader only), ``sN`` a sampler
server (``graphstore serve``, its own process on loopback, started once for every ``sN`` way) building N
batches at once for a ``ServedLoader`` with N requests in flight (distributed loader only). In one
process, each repeat runs one pass per way in turn (interleaved, so a drift of the machine hits every
way alike) over the same seed nodes and the same sampler pass, so every way must give the same
batches: each batch's ``n_id`` and ``edge_index`` are hashed (after the timed pass) and compared; the
exit code is 1 if they differ. Prints batches/s per way (median over repeats), the ratio to the first
way (median of the per-repeat ratios), and the load average before and after (a figure taken while
other work runs is not worth keeping).

``--step-ms MS`` also times each way with a stand-in training step after every batch: MS milliseconds of
Python holding the GIL, as a training loop's Python does (so it runs on a CPU machine): the rate the
loader delivers while the model trains, and the share of the time the step waited for its batch.

The benchmark runs under the allocator graphstore-train gives its ranks (jemalloc where the machine
has it, ``GRAPHSTORE_MALLOC``: it re-executes itself with the preload) and prints which.

``--train`` also runs ``graphstore-train DATA --loader-only --nproc 1 --loader-threads N`` (or
``--loader-workers N`` for ``pN``) for each way (its own per-rank batches/s, over the training seeds, two
epochs: the second is reported).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


def _ways(raw: str) -> str:
    """An argparse type: comma-separated ways to build batches: ``N`` threads, ``pN`` processes, ``sN`` served."""
    items = raw.split(",")
    if not items or not all(w.lstrip("ps").isdigit() and len(w) - len(w.lstrip("ps")) <= 1 and int(w.lstrip("ps")) >= 1
                            for w in items):
        raise argparse.ArgumentTypeError(f"{raw!r}: give loader thread counts N, sampler process counts pN and "
                                         "requests in flight to a sampler server sN, e.g. 1,2,p1,p2,s2")
    return raw


@contextlib.contextmanager
def _sampler_server(dest: Path, in_flight: int) -> Iterator[tuple[str, Any]]:
    """``graphstore serve DEST`` (one server, loopback) and a trainer's connections to it (``in_flight``
    each building a batch at once); the server is told the job finished, and must exit 0."""
    from sampling.remote.client import SamplerServers
    from training.cluster.world import free_port

    address = f"127.0.0.1:{free_port()}"
    cmd = [str(Path(sys.executable).parent / "graphstore"), "serve", str(dest), "--address", address, "--servers",
           "1", "--rank", "0", "--timeout", "300"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=benchinfo.child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    client = None
    try:
        client = SamplerServers(address, timeout=300, job="bench", trainer=0, trainers=1, in_flight=in_flight)
        yield address, client.connect()
        client.close(finished=True)
        client = None
        log = server.communicate(timeout=120)[0]
        if server.returncode != 0:
            raise SystemExit(f"tools/bench_loader.py: the sampler server exited {server.returncode}:\n{log[-2000:]}")
    finally:
        if client is not None:
            client.close(finished=False)
        if server.poll() is None:
            server.kill()
            server.wait(30)


def _loader(ds: Any, kind: str, seeds: torch.Tensor, way: str, batch_size: int, prefetch: int,
            servers: Any = None) -> Any:
    if way.startswith("s"):
        if kind == "in-process":
            raise SystemExit("tools/bench_loader.py: error: sampler servers (sN) serve the distributed loader's "
                             "batches; drop --loader in-process")
        from sampling.remote.client import ServedLoader

        return ServedLoader(servers, "node", FANOUT, seeds, batch_size=batch_size, seed=0, loader_threads=int(way[1:]),
                            prefetch=prefetch)
    processes = int(way[1:]) if way.startswith("p") else 0
    options = dict(batch_size=batch_size, seed=0, loader_threads=1 if processes else int(way), prefetch=prefetch,
                   **({"num_workers": processes} if processes else {}))
    if kind == "in-process":
        if processes:
            raise SystemExit("tools/bench_loader.py: error: sampler processes (pN) are the distributed loader's; "
                             "drop --loader in-process")
        from sampling import NeighborLoader

        return NeighborLoader(ds, FANOUT, input_nodes=seeds, **options)
    from sampling.distributed.dist_loader import DistributedNeighborLoader
    from sampling.distributed.server import PartitionServer
    from sampling.distributed.transport import LoopbackTransport

    (transport,) = LoopbackTransport.group(1)
    PartitionServer(ds, 0).register(transport)
    return DistributedNeighborLoader(ds, FANOUT, transport, seeds, filter_per_worker=False, edge_ids=False, **options)


def _step(ms: float) -> None:
    """The stand-in training step: ``ms`` milliseconds of Python holding the GIL."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def _pass(loader: Any, step_ms: float = 0.0) -> tuple[float, float, list[str]]:
    """(batches/s, the share of the time spent waiting for batches, a digest of each batch) of one pass;
    the digests are taken after the clock stops."""
    sampler = loader.node_sampler
    sampler.set_epoch(0)  # every pass is the same pass (its streams): the batches must not depend on the way
    kept = []
    start = time.perf_counter()
    batches = benchinfo.Waited(loader)
    for batch in batches:
        kept.append((batch.n_id, batch.edge_index))  # the features go: a pass keeps no 100 MB batches
        del batch
        if step_ms:
            _step(step_ms)
    seconds = time.perf_counter() - start
    digests = [hashlib.blake2b(n_id.numpy().tobytes() + edges.numpy().tobytes(), digest_size=8).hexdigest()
               for n_id, edges in kept]
    return len(kept) / seconds, batches.seconds / seconds, digests


def run(args: argparse.Namespace) -> dict[str, Any]:
    dest = benchinfo.ingested(args.data, SPEC, 1)
    ds = graphstore.open_dataset(dest)
    n = ds.num_nodes()
    seeds = torch.from_numpy(benchinfo.rng(args.seed, 0).permutation(n)[: args.batches * args.batch_size])
    ways = args.threads.split(",")
    served = [int(w[1:]) for w in ways if w.startswith("s")]
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(_sampler_server(dest, max(served)))[1] if served else None
        loaders = {w: _loader(ds, args.loader, seeds, w, args.batch_size, args.prefetch, client) for w in ways}
        out = _timed(ways, loaders, args)
    if args.train:
        out["graphstore_train"] = {w: _train(dest, w, args) for w in ways}
    return out


def _timed(ways: list[str], loaders: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    for w in ways:
        _pass(loaders[w])  # warm-up: kernels loaded, pages mapped, the heap grown, sampler processes started
    steps = [0.0, args.step_ms] if args.step_ms else [0.0]
    rates: dict[tuple[str, float], list[float]] = {(w, m): [] for w in ways for m in steps}
    waits: dict[tuple[str, float], list[float]] = {(w, m): [] for w in ways for m in steps}
    digests: dict[str, list[str]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for m in steps:
            for w in ways:
                rate, wait, digest = _pass(loaders[w], m)
                rates[w, m].append(rate)
                waits[w, m].append(wait)
                if digests.setdefault(w, digest) != digest:
                    digests[w] = ["differs from pass to pass"]
    for loader in loaders.values():
        if getattr(loader, "_pool", None) is not None:
            loader._pool.close()
    base = ways[0]

    def figures(m: float) -> dict[str, Any]:
        return {"batches_per_s": {w: [round(r, 3) for r in rates[w, m]] for w in ways},
                "median_batches_per_s": {w: round(statistics.median(rates[w, m]), 3) for w in ways},
                "ratio_to_first": {w: round(statistics.median(a / b for a, b in zip(rates[w, m], rates[base, m])), 3)
                                   for w in ways},
                "median_data_wait_share": {w: round(statistics.median(waits[w, m]), 3) for w in ways}}

    out = {"spec": SPEC, "loader": args.loader, "fanout": FANOUT, "batch_size": args.batch_size,
           "batches_per_pass": args.batches, "repeats": args.repeats, "prefetch": args.prefetch, "ways": ways,
           "load_average_1min_before": round(load_before, 2), "load_average_1min_after": round(os.getloadavg()[0], 2),
           **{k: v for k, v in figures(0.0).items() if k != "median_data_wait_share"},
           "same_batches": all(digests[w] == digests[base] for w in ways)}
    if args.step_ms:
        out["with_step"] = {"step_ms": args.step_ms, **figures(args.step_ms)}
    return out


def _train(dest: Path, way: str, args: argparse.Namespace) -> Any:
    """``graphstore-train --loader-only`` built ``way``: the last epoch's batches/s of rank 0."""
    flag = ["--loader-workers", way[1:]] if way.startswith("p") else ["--loader-threads", way.lstrip("s")]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        if way.startswith("s"):  # a server of its own for the job (it exits when the job's trainer finishes)
            flag += ["--servers", stack.enter_context(_sampler_server(dest, 1))[0]]
        metrics = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "training.launch", str(dest), "--loader-only", "--nproc", "1",
               *flag, "--fanout", ",".join(map(str, FANOUT)),
               "--batch-size", str(args.batch_size), "--epochs", "2", "--no-progress", "--metrics-out", str(metrics)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=benchinfo.child_env())
        if done.returncode != 0:
            return {"error": done.stderr[-2000:], "command": " ".join(cmd)}
        epochs = json.loads(metrics.read_text())["epochs"]
        return {"loader_batches_per_s": epochs[-1]["loader_batches_per_s"], "command": " ".join(cmd)}


def _under_ranks_allocator(argv: list[str] | None) -> None:
    """Re-execute this script under the allocator graphstore-train preloads for its ranks, once."""
    from training.launcher import allocator

    env = allocator.preload_env(dict(os.environ))
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and "GRAPHSTORE_BENCH_REEXEC" not in os.environ:
        args = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, __file__, *args], {**env, "GRAPHSTORE_BENCH_REEXEC": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--data", type=Path, default=ROOT / "bench-out" / "loader", help="where the graph is ingested")
    parser.add_argument("--loader", choices=("distributed", "in-process"), default="distributed")
    parser.add_argument("--threads", type=_ways, default="1,2,3",
                        help="ways to build batches: N loader threads, pN sampler processes; the first is the baseline")
    parser.add_argument("--step-ms", type=toolargs.number(0), default=0.0,
                        help="also time each way beside a stand-in training step of this many ms holding the GIL")
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
    from training.launcher import allocator

    result = run(args)
    out = {**info, "allocator": allocator.name(), **result}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['spec']}, 1 partition; {args.loader} loader, fanout {FANOUT}, batch {args.batch_size}, "
              f"{args.batches} batches a pass, {args.repeats} interleaved repeats, prefetch {args.prefetch}; "
              f"allocator {out['allocator']}")
        for w, rate in out["median_batches_per_s"].items():
            print(f"  {_name(w)}: {rate:7.2f} batches/s  ({out['ratio_to_first'][w]:.2f}x {_name(ways_base(out))}; "
                  f"passes {out['batches_per_s'][w]})")
        step = out.get("with_step")
        for w, rate in (step or {}).get("median_batches_per_s", {}).items():
            print(f"  {_name(w)} beside a {step['step_ms']:g} ms step: {rate:7.2f} batches/s "
                  f"({step['ratio_to_first'][w]:.2f}x), data wait {100 * step['median_data_wait_share'][w]:.0f}% "
                  f"of the time")
        print(f"  same batches every way: {out['same_batches']}; load average "
              f"{out['load_average_1min_before']} before the timed passes, {out['load_average_1min_after']} after")
        for w, result in out.get("graphstore_train", {}).items():
            print(f"  graphstore-train --loader-only, {_name(w)}: {result}")
    benchinfo.record("bench_loader", args, out,
                     {"spec": out["spec"], "loader": args.loader, "batch_size": args.batch_size})
    return 0 if out["same_batches"] else 1


def _name(way: str) -> str:
    if way.startswith("s"):
        return f"a sampler server, {way[1:]} request(s) in flight"
    return f"{way[1:]} sampler process(es)" if way.startswith("p") else f"{way} loader thread(s)"


def ways_base(out: dict[str, Any]) -> str:
    return out["ways"][0]


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
