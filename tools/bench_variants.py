"""Benchmark every sampling variant against the plain path, in one process on the same seeds.

Usage::

    python tools/bench_variants.py [--json] [--nodes 1000000] [--edges 20000000] [--batches 4] [--repeats 3]
                                   [--mag-papers 20000] [--variants plain,weighted,...]
                                   [--source dataset|memory|both] [--pyg-lib] [--threads 1,2] [--cold]
                                   [--fanout 15,10,5]

A random graph (uniform sources and destinations, edge weights in (0, 1], edge times in [0, 10**6)),
as a one-partition dataset (``--source dataset``, the default: the path users run; ``memory``: the
same graph as a PyG ``Data``; ``both``: each variant on both, as ``<variant>`` and
``<variant>@memory``, with the dataset's ratio to memory), fanout [15, 10, 5] (``--fanout``), batch 1,024, one
thread: sampled edges per second of the plain,
weighted, temporal (``uniform`` and ``last``, every seed at time 5 * 10**5, about half of every node's
edges eligible; ``temporal_uniform_end``: every seed at 10**6, every edge eligible) and disjoint variants;
``hetero``: every edge type of a ``synthetic-mag`` graph (``--mag-papers``) from paper seeds (another
graph: its ratio compares engines, not graphs); ``distributed``: rank 0 of 2 over the same random graph
ingested into 2 partitions, the other partition served over a loopback transport (in process). Each
also as a ratio of the plain path measured in the same run. The median of ``--repeats`` passes over
the same ``--batches`` seed batches, every variant's passes interleaved (one of each per repeat, so a
change in load moves them alike); a warm-up batch (numba compilation, derived arrays) is never measured.

``--cold`` opens the dataset with a cold page cache: a child process stores its derived arrays, then its
files and those arrays are evicted (``posix_fadvise``) before this process opens it, as a dataset read back
after the page cache turned over; how the first read fills the cache decides whether the sampler's
mappings get 2 MiB pages.

``--threads 1,2`` also samples the dataset with 2 threads (each a batch at a time from a pool), each
homogeneous variant's passes interleaved with the others, as a ratio to one thread.

``--pyg-lib`` adds PyG's own ``NeighborSampler`` over the in-memory graph with the same options (its
kernels are pyg-lib's) for every homogeneous variant, interleaved with ours, and each variant's ratio
ours / pyg-lib. pyg-lib is not on the package index here: ``tools/build_pyglib.sh`` builds it from
source into a virtual environment and records how (``pyglib-build.json`` in that environment, copied
into this tool's output); run this tool with that environment's Python and ``PYTHONPATH`` at the repo.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from sampling import NeighborSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

FANOUT = [15, 10, 5]
SEED_TIME = 500_000
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "weighted": {"weight_attr": "weight"},
    "temporal_uniform": {"time_attr": "time"},
    "temporal_last": {"time_attr": "time", "temporal_strategy": "last"},
    "temporal_uniform_end": {"time_attr": "time"},  # seeds at the end of the time range: every edge eligible
    "disjoint": {"disjoint": True},
    "hetero": {},
    "distributed": {},
}


def random_graph(nodes: int, edges: int, seed: int) -> Data:
    """Uniform random edges with a weight in (0, 1] and an integer time per edge."""
    rng = np.random.default_rng(seed)
    edge_index = torch.from_numpy(rng.integers(0, nodes, (2, edges), dtype=np.int64))
    weight = torch.from_numpy(1.0 - rng.random(edges))
    etime = torch.from_numpy(rng.integers(0, 10**6, edges, dtype=np.int64))
    return Data(edge_index=edge_index, num_nodes=nodes, weight=weight, time=etime)


def _rate(sample: Callable[[torch.Tensor], int], batches: list[torch.Tensor], repeats: int) -> float:
    """Median sampled edges per second over ``repeats`` passes of ``batches`` (after one warm-up batch)."""
    sample(batches[0])
    runs = []
    for _ in range(repeats):
        start, edges = time.perf_counter(), 0
        for seeds in batches:
            edges += sample(seeds)
        runs.append(edges / (time.perf_counter() - start))
    return sorted(runs)[len(runs) // 2]


def _edges(out: Any) -> int:
    return int(sum(r.numel() for r in out.row.values())) if isinstance(out.row, dict) else int(out.row.numel())


def hetero_sampler(papers: int, batches: int, batch_size: int, seed: int, tmp: Path, fanout: list[int] = FANOUT
                   ) -> tuple[Callable[[torch.Tensor], int], list[torch.Tensor]]:
    """Sampling over every edge type of a synthetic-mag graph from paper seeds, and its seed batches."""
    dest = tmp / "mag"
    graphstore.ingest(f"synthetic-mag:papers={papers},classes=16,features=8,seed=0", dest)
    ds = graphstore.open_dataset(dest, cache_dir=tmp / "cache")  # derived arrays go with tmp
    sampler = NeighborSampler(ds, fanout, seed=0)
    rng = np.random.default_rng(seed)
    n = ds.num_nodes("paper")
    seeds = [torch.from_numpy(rng.choice(n, min(batch_size, n), replace=False)) for _ in range(batches)]
    return (lambda s: _edges(sampler.sample_from_nodes(NodeSamplerInput(None, s, input_type="paper")))), seeds


def distributed_sampler(data: Data, batches: list[torch.Tensor], tmp: Path, fanout: list[int] = FANOUT
                        ) -> tuple[Callable[[torch.Tensor], int], list[torch.Tensor]]:
    """Rank 0 of 2 (own partition local, the other over a loopback transport), and its seed batches."""
    from graphstore.dataset.rank_layout import RankLayout
    from sampling.distributed.dist_sampler import DistributedSampler
    from sampling.distributed.server import PartitionServer
    from sampling.distributed.transport import LoopbackTransport

    dest = tmp / "parts2"
    graphstore.ingest(Data(edge_index=data.edge_index, num_nodes=data.num_nodes), dest, num_parts=2, method="random")
    ds = graphstore.open_dataset(dest, cache_dir=tmp / "cache")  # derived arrays go with tmp
    transports = LoopbackTransport.group(2)
    for rank, transport in enumerate(transports):
        PartitionServer(ds, rank).register(transport)
    sampler = DistributedSampler(ds, fanout, transports[0], RankLayout(2, 2), seed=0)
    lo, hi = (int(v) for v in ds.node_offsets()[:2])
    owned = [s % (hi - lo) + lo for s in batches]  # rank 0's seeds are its own nodes (as in training)
    return (lambda s: _edges(sampler.sample_from_nodes(NodeSamplerInput(None, s)))), owned


def homogeneous_sampler(graph: Any, name: str, engine: type | None = None, fanout: list[int] = FANOUT
                        ) -> Callable[[torch.Tensor], int]:
    """One variant's sampler over ``graph`` (a dataset or a ``Data``): ours, or ``engine`` (PyG's)."""
    options = VARIANTS[name]
    sampler = (engine(graph, fanout, **options) if engine is not None else
               NeighborSampler(graph, fanout, seed=0, **options))
    timed = "time_attr" in options
    seed_time = 10**6 if name.endswith("_end") else SEED_TIME

    def sample(seeds: torch.Tensor) -> int:
        when = torch.full((len(seeds),), seed_time, dtype=torch.int64) if timed else None
        return int(sampler.sample_from_nodes(NodeSamplerInput(None, seeds, when)).row.numel())

    return sample


def as_dataset(data: Data, tmp: Path, cold: bool = False, variants: list[str] | None = None,
               seeds: torch.Tensor | None = None) -> graphstore.Dataset:
    """``data`` (edges with weight and time) ingested as a one-partition dataset, opened. ``cold``: first
    a child process samples ``seeds`` with each of ``variants`` (so their derived arrays are stored), then
    the dataset's files and the stored arrays are evicted from the page cache, and only then is it opened
    here (evicting skips pages a process maps: this one maps nothing of it before)."""
    dest = tmp / "one-part"
    graphstore.ingest(data, dest, num_parts=1, to_undirected=False)
    if cold:
        child = multiprocessing.get_context("spawn").Process(target=_store_derived, args=(tmp, variants, seeds))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"bench_variants: --cold: the process storing the derived arrays failed ({child.exitcode})")
        evict(tmp)
    return graphstore.open_dataset(dest, cache_dir=tmp / "cache")  # derived arrays go with tmp


def _store_derived(tmp: Path, variants: list[str], seeds: torch.Tensor) -> None:
    ds = graphstore.open_dataset(tmp / "one-part", cache_dir=tmp / "cache")
    for name in variants:
        homogeneous_sampler(ds, name)(seeds)


def evict(folder: Path) -> None:
    """Drop every file under ``folder`` from the page cache (written back first; ``posix_fadvise``)."""
    os.sync()
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def pyg_lib_engine() -> tuple[type, dict[str, Any]]:
    """PyG's NeighborSampler (pyg-lib's kernels) and how that pyg-lib was built; a one-line error without it."""
    try:
        import pyg_lib
        from torch_geometric.sampler import NeighborSampler as PyGSampler
        from torch_geometric.typing import WITH_PYG_LIB
    except ImportError as exc:
        raise SystemExit(f"bench_variants: --pyg-lib needs pyg-lib ({exc}); build it with tools/build_pyglib.sh "
                         "and run this tool with that environment's python") from exc
    if not WITH_PYG_LIB:
        raise SystemExit("bench_variants: PyG does not use the installed pyg-lib (torch_geometric.typing.WITH_PYG_LIB "
                         "is False); rebuild pyg-lib against this torch with tools/build_pyglib.sh")
    build_file = Path(sys.prefix) / "pyglib-build.json"
    build = json.loads(build_file.read_text()) if build_file.is_file() else {
        "note": f"no {build_file}: this pyg-lib was not built by tools/build_pyglib.sh"}
    return PyGSampler, {"version": pyg_lib.__version__, "module": str(Path(pyg_lib.__file__).parent),
                        "torch": torch.__version__, "build": build}


def measure(samples: dict[str, tuple[Callable[[torch.Tensor], int], list[torch.Tensor]]], repeats: int
            ) -> dict[str, float]:
    """Sampled edges/s of each sampler over its seed batches: the passes are interleaved (every sampler
    once per repeat), so a change in machine load during the run moves every variant alike; the
    median pass of each. A warm-up batch (numba compilation, derived arrays) is never measured."""
    for sample, batches in samples.values():
        sample(batches[0])
    runs: dict[str, list[float]] = {name: [] for name in samples}
    for _ in range(repeats):
        for name, (sample, batches) in samples.items():
            start, edges = time.perf_counter(), 0
            for seeds in batches:
                edges += sample(seeds)
            runs[name].append(edges / (time.perf_counter() - start))
    return {name: sorted(r)[len(r) // 2] for name, r in runs.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    start = time.perf_counter()
    data = random_graph(args.nodes, args.edges, args.seed % 2**32)
    rng = benchinfo.rng(args.seed, 1)
    batches = [torch.from_numpy(rng.choice(args.nodes, args.batch_size, replace=False)) for _ in range(args.batches)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-variants-"))
    engine, pyg_lib = pyg_lib_engine() if args.pyg_lib else (None, None)
    pools: list[ThreadPoolExecutor] = []
    try:
        homogeneous = [name for name in args.variants if name not in ("hetero", "distributed")]
        samples = {}
        if args.source in ("dataset", "both"):
            ds = as_dataset(data, tmp, args.cold, homogeneous, batches[0])
            samples.update({name: (homogeneous_sampler(ds, name, fanout=args.fanout), batches) for name in homogeneous})
        if args.source in ("memory", "both"):
            suffix = "@memory" if args.source == "both" else ""
            samples.update({name + suffix: (homogeneous_sampler(data, name, fanout=args.fanout), batches)
                            for name in homogeneous})
        if engine is not None:
            samples.update({f"{name}@pyg-lib": (homogeneous_sampler(data, name, engine, args.fanout), batches)
                            for name in homogeneous})
        for count in args.threads[1:]:  # the first count is the baseline the rates above are measured with
            pool = ThreadPoolExecutor(count)
            pools.append(pool)
            for name in homogeneous:
                sample = samples[name][0]
                samples[f"{name}@{count}threads"] = (
                    lambda group, sample=sample, pool=pool: sum(pool.map(sample, group)), [batches])
        if "hetero" in args.variants:
            samples["hetero"] = hetero_sampler(args.mag_papers, args.batches, args.batch_size, args.seed, tmp,
                                                args.fanout)
        if "distributed" in args.variants:
            samples["distributed"] = distributed_sampler(data, batches, tmp, args.fanout)
        setup = time.perf_counter() - start
        rates = measure(samples, args.repeats)
    finally:
        for pool in pools:
            pool.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    plain = rates.get("plain")
    ours = {k: v for k, v in rates.items() if "@" not in k}
    out = {"graph": {"nodes": args.nodes, "edges": args.edges}, "source": args.source, "cold": bool(args.cold),
           "fanout": args.fanout,
           "batch_size": args.batch_size, "threads": 1, "setup_seconds": setup, "edges_per_s": rates,
           "ratio_to_plain": {k: v / plain for k, v in ours.items()} if plain else {}}
    if args.source == "both":
        out["ratio_to_memory"] = {k: v / rates[f"{k}@memory"] for k, v in ours.items() if f"{k}@memory" in rates}
    for count in args.threads[1:]:
        out.setdefault("ratio_to_one_thread", {})[str(count)] = {
            k: rates[f"{k}@{count}threads"] / v for k, v in ours.items() if f"{k}@{count}threads" in rates}
    if pyg_lib is not None:
        out["pyg_lib"] = pyg_lib
        out["ratio_to_pyg_lib"] = {k: v / rates[f"{k}@pyg-lib"] for k, v in ours.items() if f"{k}@pyg-lib" in rates}
    return out


def _fanout(text: str) -> list[int]:
    try:
        fanout = [int(v) for v in text.split(",")]
    except ValueError:
        fanout = []
    if not fanout or any(k == 0 or k < -1 for k in fanout):
        raise argparse.ArgumentTypeError(f"{text!r}: give neighbours per hop, comma-separated, e.g. 15,10,5 (-1: all)")
    return fanout


def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        counts = []
    if not counts or counts[0] != 1 or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: give thread counts starting with 1, e.g. 1,2")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=toolargs.count, default=1_000_000)
    parser.add_argument("--edges", type=toolargs.count, default=20_000_000)
    parser.add_argument("--batches", type=toolargs.count, default=4)
    parser.add_argument("--repeats", type=toolargs.count, default=3)
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--fanout", type=_fanout, default=FANOUT, metavar="15,10,5",
                        help="neighbours per hop, comma-separated (-1: all of them)")
    parser.add_argument("--mag-papers", type=toolargs.count, default=20_000,
                        help="papers of the synthetic-mag graph (hetero)")
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS),
                        help=f"comma-separated, among {','.join(VARIANTS)}")
    parser.add_argument("--source", choices=("dataset", "memory", "both"), default="dataset",
                        help="the random graph as a one-partition dataset (default), as a PyG Data in memory, or both")
    parser.add_argument("--threads", type=_thread_counts, default=[1], metavar="1,2",
                        help="also sample the dataset with these many threads (a batch each) after the first count, "
                             "1: each homogeneous variant's edges/s as a ratio to one thread (use --batches 16+)")
    parser.add_argument("--pyg-lib", action="store_true",
                        help="also PyG's NeighborSampler (pyg-lib's kernels) on every homogeneous variant, in memory")
    parser.add_argument("--cold", action="store_true",
                        help="open the dataset with a cold page cache (its files and derived arrays evicted), as a "
                             "dataset read back after the cache turned over; Linux")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants {unknown}: choose among {list(VARIANTS)}")
    if len(args.threads) > 1 and args.source == "memory":
        parser.error("--threads measures the dataset: use --source dataset or both")
    if args.cold and (args.source == "memory" or not hasattr(os, "posix_fadvise")):
        parser.error("--cold evicts a dataset's files from the page cache: use --source dataset or both, on Linux")
    if args.pyg_lib:
        pyg_lib_engine()  # refused here, before the graph is built, when pyg-lib cannot load
    info = benchinfo.start(args, args.json)
    out = {**info, **run(args)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    benchinfo.record("bench_variants", args, out, {"nodes": args.nodes, "edges": args.edges, "source": args.source,
                                                   "pyg_lib": args.pyg_lib, "cold": bool(args.cold),
                                                   "fanout": args.fanout})
    return 0


def _print(out: dict) -> None:
    g = out["graph"]
    cold = ", cold page cache" if out.get("cold") else ""
    print(f"graph: {g['nodes']:,} nodes, {g['edges']:,} edges (random, {out['source']}{cold}); fanout {out['fanout']}, "
          f"batch {out['batch_size']}, 1 thread")
    for name, eps in out["edges_per_s"].items():
        notes = [f"{out[key][name]:5.2f}x {label}" for key, label in (
            ("ratio_to_plain", "plain"), ("ratio_to_memory", "in memory"), ("ratio_to_pyg_lib", "pyg-lib"))
            if name in out.get(key, {})]
        notes += [f"{ratios[name]:5.2f}x with {count} threads" for count, ratios in
                  out.get("ratio_to_one_thread", {}).items() if name in ratios]
        print(f"  {name:<26} {eps / 1e6:8.2f} M sampled edges/s  " + ", ".join(notes))
    if "pyg_lib" in out:
        lib = out["pyg_lib"]
        print(f"pyg-lib {lib['version']} ({lib['module']}), torch {lib['torch']}; build: "
              f"{json.dumps(lib['build'])[:300]}")


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
