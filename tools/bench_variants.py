"""Benchmark every sampling variant against the plain path, in one process on the same seeds.

Usage::

    python tools/bench_variants.py [--json] [--nodes 1000000] [--edges 20000000] [--batches 4] [--repeats 3]
                                   [--mag-papers 20000] [--variants plain,weighted,...]
                                   [--degrees uniform,skewed] [--seed-times early,middle,late,spread]
                                   [--fanout 15,10,5 --fanout 20,20]
                                   [--source dataset|memory|both] [--pyg-lib] [--threads 1,2] [--cold]

A matrix of workload shapes, by default every one: random graphs of ``--nodes`` and ``--edges`` (edge
weights in (0, 1], edge times in [0, 10**6)) whose degrees are ``uniform`` (sources and destinations
uniform) or ``skewed`` (a power law: low IDs are hubs, as in real graphs; destinations ``N * u**3``,
sources ``N * u**2``), sampled with each ``--fanout`` (default [15, 10, 5] and [20, 20]), batch 1,024, one
thread; the temporal variants (``uniform`` and ``last``) also at each seed time: ``early`` (every seed at
2.5 * 10**5, a quarter of each node's edges eligible), ``middle`` (5 * 10**5, half), ``late`` (10**6,
every edge eligible) and ``spread`` (each seed its own time in [5 * 10**5, 10**6], three quarters eligible
on average). Each graph is a one-partition dataset (``--source dataset``, the default: the path users run;
``memory``: the same graph as a PyG ``Data``; ``both``: each variant on both, as ``<variant>`` and
``<variant>@memory``, with the dataset's ratio to memory). Variants: plain, weighted, temporal
(``uniform``, ``last``), disjoint, masked (messages over the train links only, as link prediction samples:
``MessageEdges(allowed=(0,))`` over each edge's ``link_split``, drawn 80/10/10 as ``graphstore ingest
--link-split`` splits by default, and stored with the dataset); link (as link prediction trains: masked,
and each batch a link batch whose own links are excluded, ``exclude_seed_edges=True``; its links join the
first half of the batch's seeds to the second, so it samples from the same seed nodes as the others);
``hetero``: every edge type of a ``synthetic-mag`` graph (``--mag-papers``) from paper seeds (another
graph: its ratio compares engines, not graphs); ``distributed``: rank 0 of 2 over the same graph ingested
into 2 partitions, the other partition served over a loopback transport (in process). Every variant's
sampled edges/s, as a ratio of the plain path on the same graph and fanout, measured in the same run: the
median of ``--repeats`` passes over the same ``--batches`` seed batches, the passes of every variant on
one graph and fanout interleaved (one of each per repeat, so a change in load moves them alike); a warm-up
batch (numba compilation, derived arrays) is never measured. ``worst`` names each variant's lowest ratio
to plain over the shapes and where. A variant that may sample only some edges (the temporal ones at a fixed
seed time, masked and link) takes fewer than the fanout from a node with few of them, so it samples fewer
edges per node than plain; each is also compared with the plain path over only the edges it may sample (a
dataset of the edges eligible at that time, of the train links), as ``ratio_to_eligible_plain``.

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
from torch_geometric.sampler import EdgeSamplerInput, NodeSamplerInput

import graphstore
from sampling import MessageEdges, NeighborSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

FANOUT = [15, 10, 5]
FANOUTS = [[15, 10, 5], [20, 20]]
TIME_RANGE = 10**6  # edge times are drawn from [0, TIME_RANGE)
SEED_TIMES = {"early": (0.25, 0.25), "middle": (0.5, 0.5), "late": (1.0, 1.0), "spread": (0.5, 1.0)}  # of TIME_RANGE
DEGREES = ("uniform", "skewed")
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "weighted": {"weight_attr": "weight"},
    "temporal_uniform": {"time_attr": "time"},
    "temporal_last": {"time_attr": "time", "temporal_strategy": "last"},
    "disjoint": {"disjoint": True},
    "masked": {"message_edges": MessageEdges(allowed=(0,))},
    "link": {"message_edges": MessageEdges(allowed=(0,)), "exclude_seed_edges": True},
    "hetero": {},
    "distributed": {},
}
TEMPORAL = ("temporal_uniform", "temporal_last")
MASKED = ("masked", "link")  # sample the train links only (each edge's link_split 0)
OURS_ONLY = MASKED  # no PyG sampler option to compare with (PyG masks by building another graph)
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)  # each edge's link split (train, val, test), as `ingest --link-split` defaults


def random_graph(nodes: int, edges: int, seed: int, degrees: str = "uniform") -> Data:
    """Random edges with a weight in (0, 1], an integer time in [0, TIME_RANGE) and a link split
    (:data:`SPLIT_FRACTIONS`) per edge: ``uniform`` sources and destinations, or ``skewed`` (a power law, low IDs
    the hubs: ``N * u**3`` destinations, ``N * u**2`` sources)."""
    rng = np.random.default_rng(seed)
    if degrees == "skewed":
        dst = (nodes * rng.random(edges) ** 3).astype(np.int64)
        src = (nodes * rng.random(edges) ** 2).astype(np.int64)
        edge_index = torch.from_numpy(np.stack([src, dst]))
    else:
        edge_index = torch.from_numpy(rng.integers(0, nodes, (2, edges), dtype=np.int64))
    weight = torch.from_numpy(1.0 - rng.random(edges))
    etime = torch.from_numpy(rng.integers(0, TIME_RANGE, edges, dtype=np.int64))
    split = torch.from_numpy(rng.choice(3, edges, p=SPLIT_FRACTIONS).astype(np.int8))  # drawn last: the rest as before
    return Data(edge_index=edge_index, num_nodes=nodes, weight=weight, time=etime, link_split=split)


def seed_times(seeds: torch.Tensor, when: str) -> torch.Tensor:
    """Each seed's time at ``when`` (:data:`SEED_TIMES`); ``spread``: a time of its own in the range, fixed
    by its ID (the same for every variant and pass)."""
    lo, hi = (int(f * TIME_RANGE) for f in SEED_TIMES[when])
    if hi == lo:
        return torch.full((len(seeds),), lo, dtype=torch.int64)
    return lo + (seeds.to(torch.int64) * 2654435761) % (hi - lo + 1)


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
    if not dest.exists():  # one ingest, whatever the fanouts
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
    if not dest.exists():  # one ingest per graph, whatever the fanouts
        graphstore.ingest(Data(edge_index=data.edge_index, num_nodes=data.num_nodes), dest, num_parts=2,
                          method="random")
    ds = graphstore.open_dataset(dest, cache_dir=tmp / "cache")  # derived arrays go with tmp
    transports = LoopbackTransport.group(2)
    for rank, transport in enumerate(transports):
        PartitionServer(ds, rank).register(transport)
    sampler = DistributedSampler(ds, fanout, transports[0], RankLayout(2, 2), seed=0)
    lo, hi = (int(v) for v in ds.node_offsets()[:2])
    owned = [s % (hi - lo) + lo for s in batches]  # rank 0's seeds are its own nodes (as in training)
    return (lambda s: _edges(sampler.sample_from_nodes(NodeSamplerInput(None, s)))), owned


def homogeneous_sampler(graph: Any, name: str, engine: type | None = None, fanout: list[int] = FANOUT,
                        when: str = "middle", sampler: Any = None) -> Callable[[torch.Tensor], int]:
    """One variant's sampler over ``graph`` (a dataset or a ``Data``): ours, or ``engine`` (PyG's); a temporal
    one's seeds at the seed time ``when``. ``sampler``: one made before for the same variant and fanout
    (one per seed time would hold as many copies of an in-memory graph's topology)."""
    options = VARIANTS[name]
    if sampler is None:
        sampler = (engine(graph, fanout, **options) if engine is not None else
                   NeighborSampler(graph, fanout, seed=0, **options))
    timed = "time_attr" in options
    links = options.get("exclude_seed_edges", False)

    def sample(seeds: torch.Tensor) -> int:
        at = seed_times(seeds, when) if timed else None
        if links:  # the same seed nodes as a link batch: half the links' sources, half their destinations
            half = len(seeds) // 2
            return int(sampler.sample_from_edges(EdgeSamplerInput(None, seeds[:half], seeds[half:])).row.numel())
        return int(sampler.sample_from_nodes(NodeSamplerInput(None, seeds, at)).row.numel())

    sample.sampler = sampler  # type: ignore[attr-defined]
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


def _shape(degrees: str, fanout: list[int], when: str | None) -> str:
    """A shape's name: ``skewed/20,20`` (every variant but the temporal ones), ``skewed/20,20/late``."""
    return "/".join([degrees, ",".join(map(str, fanout))] + ([when] if when else []))


def eligible(data: Data, when: str) -> Data | None:
    """The edges of ``data`` a seed at the fixed seed time ``when`` may sample (``None`` when every edge or
    the seed times vary): the plain path over them is what a temporal pick costs at best."""
    lo, hi = (int(f * TIME_RANGE) for f in SEED_TIMES[when])
    if lo != hi or lo >= TIME_RANGE:
        return None
    keep = data.time <= lo
    return Data(edge_index=data.edge_index[:, keep], num_nodes=data.num_nodes)


def admitted(data: Data) -> Data:
    """The edges of ``data`` the masked variants may sample (the train links): the plain path over them is
    what a masked pick costs at best, and samples as many edges."""
    keep = data.link_split == 0
    return Data(edge_index=data.edge_index[:, keep], num_nodes=data.num_nodes)


def _group(args: argparse.Namespace, ds: Any, data: Data, in_memory: bool, engine: type | None,
           batches: list[torch.Tensor], hetero: Any, distributed: Any, fanout: list[int],
           pools: list[ThreadPoolExecutor], baselines: dict[str, Any]
           ) -> dict[str, tuple[Callable[[torch.Tensor], int], list[torch.Tensor]]]:
    """Every sampler of one graph and fanout, keyed ``<variant>[~<seed time>][@memory|@pyg-lib|@Nthreads]``
    (the parts are split off again by :func:`_rows`); ``baselines``: per seed time, the graph of its
    eligible edges, sampled by the plain path as ``plain_eligible~<seed time>``."""
    samples = {f"plain_eligible~{when}": (homogeneous_sampler(graph, "plain", fanout=fanout), batches)
               for when, graph in baselines.items()}
    homogeneous = [name for name in args.variants if name not in ("hetero", "distributed")]
    for name in homogeneous:
        made: dict[str, Any] = {}  # one sampler per variant and graph, whatever the seed time

        def add(key: str, graph: Any, engine: type | None, at: str, kind: str) -> None:
            sample = homogeneous_sampler(graph, name, engine, fanout, at, made.get(kind))
            made[kind] = sample.sampler
            samples[key] = (sample, batches)

        for when in (args.seed_times if name in TEMPORAL else [None]):
            key = name if when is None else f"{name}~{when}"
            at = when or "middle"
            if ds is not None:
                add(key, ds, None, at, "dataset")
            if in_memory:
                add(key + ("@memory" if ds is not None else ""), data, None, at, "memory")
            if engine is not None and name not in OURS_ONLY:
                add(f"{key}@pyg-lib", data, engine, at, "pyg-lib")
            for count, pool in zip(args.threads[1:], pools):  # the first count is the baseline
                sample = samples[key][0]
                samples[f"{key}@{count}threads"] = (
                    lambda group, sample=sample, pool=pool: sum(pool.map(sample, group)), [batches])
    if hetero is not None:
        samples["hetero"] = hetero
    if distributed is not None:
        samples["distributed"] = distributed
    return samples


def _rows(rates: dict[str, float], degrees: str, fanout: list[int], threads: list[int]) -> list[dict[str, Any]]:
    """One row per variant (and seed time) of one graph and fanout, with its ratios."""
    plain = rates.get("plain")
    rows = []
    for key, eps in rates.items():
        if "@" in key:
            continue
        name, _, when = key.partition("~")
        if name == "plain_eligible":
            continue
        row: dict[str, Any] = {"shape": _shape(degrees, fanout, when or None), "variant": name, "degrees": degrees,
                               "fanout": fanout, "seed_time": when or None, "edges_per_s": eps,
                               "ratio_to_plain": eps / plain if plain else None}
        if name in TEMPORAL:  # against the plain path over the edges eligible at that time (every edge: plain)
            base = rates.get(f"plain_eligible~{when}", plain if when == "late" else None)
            if base:
                row["ratio_to_eligible_plain"] = eps / base
        elif name in MASKED and rates.get("plain_eligible~admitted"):  # against plain over the train links
            row["ratio_to_eligible_plain"] = eps / rates["plain_eligible~admitted"]
        if f"{key}@memory" in rates:
            row["ratio_to_memory"] = eps / rates[f"{key}@memory"]
        if f"{key}@pyg-lib" in rates:
            row["pyg_lib_edges_per_s"] = rates[f"{key}@pyg-lib"]
            row["ratio_to_pyg_lib"] = eps / rates[f"{key}@pyg-lib"]
        for count in threads[1:]:
            if f"{key}@{count}threads" in rates:
                row[f"ratio_with_{count}_threads"] = rates[f"{key}@{count}threads"] / eps
        rows.append(row)
    return rows


def worst(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, the shape where its ratio to plain is lowest (``hetero`` excepted: another graph)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        name, ratio = row["variant"], row.get("ratio_to_plain")
        if name in ("plain", "hetero") or ratio is None:
            continue
        if name not in out or ratio < out[name]["ratio_to_plain"]:  # the other lowest ratios found so far stay
            out.setdefault(name, {}).update(shape=row["shape"], ratio_to_plain=ratio, edges_per_s=row["edges_per_s"])
        fair = row.get("ratio_to_eligible_plain")
        if fair is not None and fair < out[name].get("ratio_to_eligible_plain", float("inf")):
            out[name]["ratio_to_eligible_plain"] = fair
            out[name]["ratio_to_eligible_plain_shape"] = row["shape"]
        memory = row.get("ratio_to_memory")
        if memory is not None and memory < out[name].get("ratio_to_memory_worst", float("inf")):
            out[name]["ratio_to_memory_worst"] = memory
            out[name]["ratio_to_memory_shape"] = row["shape"]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    rng = benchinfo.rng(args.seed, 1)
    batches = [torch.from_numpy(rng.choice(args.nodes, args.batch_size, replace=False)) for _ in range(args.batches)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-variants-"))
    engine, pyg_lib = pyg_lib_engine() if args.pyg_lib else (None, None)
    pools = [ThreadPoolExecutor(count) for count in args.threads[1:]]
    rows: list[dict[str, Any]] = []
    setup = 0.0
    try:
        homogeneous = [name for name in args.variants if name not in ("hetero", "distributed")]
        hetero_by_fanout = {}
        if "hetero" in args.variants:  # a graph of its own: measured with the first degrees' group
            hetero_by_fanout = {tuple(f): hetero_sampler(args.mag_papers, args.batches, args.batch_size, args.seed,
                                                         tmp, f) for f in args.fanout}
        for d, degrees in enumerate(args.degrees):
            made = time.perf_counter()
            data = random_graph(args.nodes, args.edges, (args.seed + d) % 2**32, degrees)
            where = tmp / degrees
            where.mkdir()
            ds = (as_dataset(data, where, args.cold, homogeneous, batches[0])
                  if args.source in ("dataset", "both") else None)
            baselines = {}
            if any(name in TEMPORAL for name in args.variants):
                for when in args.seed_times:
                    sub = eligible(data, when)
                    if sub is not None:
                        (where / when).mkdir()
                        baselines[when] = sub if args.source == "memory" else as_dataset(sub, where / when)
            if any(name in MASKED for name in args.variants):
                sub = admitted(data)
                (where / "admitted").mkdir()
                baselines["admitted"] = sub if args.source == "memory" else as_dataset(sub, where / "admitted")
            for fanout in args.fanout:
                dist = distributed_sampler(data, batches, where, fanout) if "distributed" in args.variants else None
                hetero = hetero_by_fanout.get(tuple(fanout)) if d == 0 else None
                samples = _group(args, ds, data, args.source != "dataset", engine, batches, hetero, dist, fanout,
                                 pools, baselines)
                setup += time.perf_counter() - made
                rows += _rows(measure(samples, args.repeats), degrees, fanout, args.threads)
                samples = dist = {}  # before the next group's samplers are made
                made = time.perf_counter()
            del data, ds, baselines
    finally:
        for pool in pools:
            pool.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"graph": {"nodes": args.nodes, "edges": args.edges}, "source": args.source, "cold": bool(args.cold),
           "fanouts": args.fanout, "degrees": args.degrees,
           "seed_times": {w: [int(f * TIME_RANGE) for f in SEED_TIMES[w]] for w in args.seed_times},
           "batch_size": args.batch_size, "threads": 1, "setup_seconds": setup, "shapes": rows, "worst": worst(rows)}
    if pyg_lib is not None:
        out["pyg_lib"] = pyg_lib
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
    parser.add_argument("--fanout", type=_fanout, action="append", default=None, metavar="15,10,5",
                        help="neighbours per hop, comma-separated (-1: all of them); give it again for another "
                             "fanout (default: 15,10,5 and 20,20)")
    parser.add_argument("--degrees", type=_choices("--degrees", DEGREES), default=list(DEGREES),
                        help=f"comma-separated graphs, among {','.join(DEGREES)}")
    parser.add_argument("--seed-times", type=_choices("--seed-times", SEED_TIMES), default=list(SEED_TIMES),
                        help=f"comma-separated seed times of the temporal variants, among {','.join(SEED_TIMES)}")
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
    args.fanout = args.fanout or [list(f) for f in FANOUTS]
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
                                                   "fanouts": args.fanout, "degrees": args.degrees,
                                                   "seed_times": args.seed_times})
    return 0


def _print(out: dict) -> None:
    g = out["graph"]
    cold = ", cold page cache" if out.get("cold") else ""
    print(f"graphs: {g['nodes']:,} nodes, {g['edges']:,} edges ({'/'.join(out['degrees'])} degrees, {out['source']}"
          f"{cold}); batch {out['batch_size']}, 1 thread; seed times {out['seed_times']}")
    for row in out["shapes"]:
        notes = [f"{row[key]:5.2f}x {label}" for key, label in (
            ("ratio_to_plain", "plain"), ("ratio_to_eligible_plain", "plain over the eligible edges"),
            ("ratio_to_memory", "in memory"), ("ratio_to_pyg_lib", "pyg-lib")) if row.get(key) is not None]
        notes += [f"{v:5.2f}x {k[len('ratio_with_'):].replace('_', ' ')}" for k, v in row.items()
                  if k.startswith("ratio_with_")]
        print(f"  {row['shape']:<22} {row['variant']:<18} {row['edges_per_s'] / 1e6:8.2f} M sampled edges/s  "
              + ", ".join(notes))
    print("worst shape of each variant (ratio to plain):")
    for name, w in out["worst"].items():
        memory = (f"; worst in-memory ratio {w['ratio_to_memory_worst']:.2f} ({w['ratio_to_memory_shape']})"
                  if "ratio_to_memory_worst" in w else "")
        fair = (f"; against plain over the eligible edges {w['ratio_to_eligible_plain']:.2f} "
                f"({w['ratio_to_eligible_plain_shape']})" if "ratio_to_eligible_plain" in w else "")
        print(f"  {name:<18} {w['ratio_to_plain']:5.2f}x at {w['shape']}{fair}{memory}")
    if "pyg_lib" in out:
        lib = out["pyg_lib"]
        print(f"pyg-lib {lib['version']} ({lib['module']}), torch {lib['torch']}; build: "
              f"{json.dumps(lib['build'])[:300]}")


def _choices(flag: str, allowed: Any) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = [v for v in text.split(",") if v]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: give {flag} among {','.join(allowed)}, comma-separated")
        return values
    return parse


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
