"""Benchmark neighbor sampling: our sampler vs a plain torch reference (and pyg-lib when installed).

Usage::

    python tools/bench_sampler.py [--json] [--data DIR] [--spec SPEC] [--parts 4] [--batches 30] [--seed S]

On an ogbn-products-shaped synthetic graph (ingested once into --data), fanout [15, 10, 5], batch
1,024, one thread: sampled edges per second and batches per second for (a) sampling alone, (b)
sampling plus feature fetch through ``sampling.NeighborLoader`` by ``num_workers`` (also over the
disjoint sampling, where sampling is a larger share of a batch); sampling alone also over the unpacked
int64 arrays and through the engine's per-hop driver (hetero and distributed sampling); and, in the same run on the same
seeds, (c) a plain torch reference sampler with the same semantics and (d) PyG's NeighborSampler
over pyg-lib when pyg-lib is importable (skipped with a message otherwise). Every pass draws fresh
random seed nodes (``--seed`` to draw the same ones again); the variants compared within a pass get the
same ones, and warm-up batches are never measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from graphstore.errors import DatasetNotFoundError
from sampling import NeighborLoader, NeighborSampler
from sampling.drivers.batch_driver import FastPath

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

WARM = 10**6  # the draw key of warm-up batches (never measured)

PRODUCTS = "synthetic:nodes=2400000,avg_degree=52,features=100,classes=47,seed=0"
FANOUT = [15, 10, 5]


def reference_sample(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts: list[int]) -> int:
    """A plain, vectorised torch sampler with the same semantics (uniform without replacement, unique
    nodes, relabelled edges). Returns the number of sampled edges.
    """
    nodes, frontier, total = seeds, seeds, 0
    for k in fanouts:
        start = indptr[frontier]
        deg = indptr[frontier + 1] - start
        owner = torch.repeat_interleave(torch.arange(len(frontier)), deg)
        group_start = torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
        perm = torch.argsort(owner.to(torch.float64) + torch.rand(len(owner), dtype=torch.float64))
        rank = torch.arange(len(perm)) - group_start  # rank of each shuffled edge inside its node
        keep = rank < k
        picked = perm[keep]
        nbrs = indices[start[owner[picked]] + (picked - group_start[picked])]
        total += len(nbrs)
        new = torch.unique(nbrs)
        new = new[~torch.isin(new, nodes)]
        nodes = torch.cat([nodes, new])
        sorted_nodes, where = torch.sort(nodes)
        _row = where[torch.searchsorted(sorted_nodes, nbrs)]  # relabelled sources
        frontier = new
    return total


def _dataset(data: Path, spec: str, parts: int) -> graphstore.Dataset:
    try:
        return graphstore.open_dataset(data)
    except DatasetNotFoundError:
        print(f"ingesting {spec} into {data} ({parts} METIS partitions, once)", file=sys.stderr)
        graphstore.ingest(spec, data, num_parts=parts, parents=True)
        return graphstore.open_dataset(data)


def _rate(fn, draw, repeats: int = 1, count: int | None = None) -> tuple[float, float]:
    """(sampled edges per second, batches per second) of ``fn(seeds) -> edges``: the median of
    ``repeats`` passes (this VM's memory speed varies from pass to pass), pass r over ``draw(r)``
    (fresh random seeds each pass; the same ones for every variant measured in pass r)."""
    fn(draw(WARM)[0])  # warm: numba compilation / page cache, on seeds never measured
    runs = []
    for r in range(repeats):
        batches = draw(r)[:count]
        start, edges = time.perf_counter(), 0
        for seeds in batches:
            edges += fn(seeds)
        seconds = time.perf_counter() - start
        runs.append((edges / seconds, len(batches) / seconds))
    return sorted(runs)[len(runs) // 2]


def _sampler_rate(ds: graphstore.Dataset, draw, path: str, repeats: int, seed: int) -> tuple[float, float]:
    """Sampling alone with ``path``: "fast" (the one-call kernel over the packed layout, the default),
    "unpacked" (the same kernel over the int64 indices/eid arrays: datasets without ``packed``) or
    "per_hop" (the engine's per-hop driver, which heterogeneous and distributed sampling take, forced on
    this homogeneous graph; the variants are measured by tools/bench_variants.py)."""
    sampler = NeighborSampler(ds, FANOUT, seed=seed)
    if path == "per_hop":
        sampler._fast_path = None
    elif path == "unpacked":
        sampler._fast_path = FastPath(sampler.topology[None], sampler.num_nodes, sampler._fanouts, False,
                                      packed=False)
    elif sampler.fast_path is None or not sampler.fast_path.use_packed:
        print("this dataset has no packed topology (ingested before it existed?): re-ingest it", file=sys.stderr)
    return _rate(lambda s: int(sampler.sample_from_nodes(NodeSamplerInput(None, s)).row.numel()), draw, repeats)


def _loader_rate(ds: graphstore.Dataset, draw, key: int, batch_size: int, workers: int, seed: int,
                 filter_per_worker: bool | None = None, count: int | None = None, **options: bool
                 ) -> tuple[float, float]:
    """(edges/s, batches/s) of one pass of ``NeighborLoader`` (sampling + feature fetch) with ``workers``
    over seeds of its own (``draw(key)``), after a warm-up batch (its first, so 1 batch of the pass is
    read twice: persistent workers need the same loader)."""
    loader = NeighborLoader(ds, FANOUT, input_nodes=torch.cat(draw(key)[:count]), batch_size=batch_size, seed=seed,
                            num_workers=workers, persistent_workers=workers > 0, filter_per_worker=filter_per_worker,
                            **options)
    next(iter(loader))  # warm: workers started, kernels compiled
    start = time.perf_counter()
    edges = sum(b.edge_index.size(1) for b in loader)
    seconds = time.perf_counter() - start
    return edges / seconds, len(loader) / seconds


def _pyglib(ds: graphstore.Dataset, draw) -> dict | None:
    try:
        import pyg_lib  # noqa: F401
        from torch_geometric.data import Data
        from torch_geometric.sampler import NeighborSampler as PyGSampler
    except ImportError:
        print("pyg-lib is not installed here: skipping the PyG/pyg-lib comparison", file=sys.stderr)
        return None
    from graphstore.dataset.whole import DatasetGraphStore

    src, dst = DatasetGraphStore(ds).get_edge_index(None, "coo")
    sampler = PyGSampler(Data(edge_index=torch.stack([src, dst]), num_nodes=ds.num_nodes()), FANOUT)
    eps, bps = _rate(lambda s: int(sampler.sample_from_nodes(NodeSamplerInput(None, s)).row.numel()), draw)
    return {"edges_per_s": eps, "batches_per_s": bps}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    ds = _dataset(args.data, args.spec, args.parts)
    n = ds.num_nodes()

    def draw(*keys: int) -> list[torch.Tensor]:
        return [torch.from_numpy(benchinfo.rng(args.seed, *keys, b).choice(n, args.batch_size, replace=False))
                for b in range(args.batches)]

    seed = args.seed % 2**31
    ours = _sampler_rate(ds, draw, "fast", args.repeats, seed)
    unpacked = _sampler_rate(ds, draw, "unpacked", args.repeats, seed)
    per_hop = _sampler_rate(ds, draw, "per_hop", 1, seed)
    with_features, loader_bps = _loader_rate(ds, draw, 100, args.batch_size, 0, seed)
    workers = {w: _loader_rate(ds, draw, 101, args.batch_size, w, seed)[1] for w in (args.workers,)}
    workers[f"{args.workers}, rows fetched in the workers"] = _loader_rate(
        ds, draw, 102, args.batch_size, args.workers, seed, filter_per_worker=True)[1]
    # where sampling is a larger share of a batch (disjoint: more nodes per batch), on a third of the batches
    few = max(3, args.batches // 3)
    disjoint_workers = {w: _loader_rate(ds, draw, 103 + w, args.batch_size, w, seed, count=few, disjoint=True)[1]
                        for w in (0, args.workers)}
    from graphstore.dataset.whole import DatasetGraphStore

    indices, indptr = DatasetGraphStore(ds).get_edge_index(None, "csc")
    ref = _rate(lambda s: reference_sample(indptr, indices, s, FANOUT), draw, 1, few)
    out = {"graph": {"nodes": n, "edges": int(len(indices)), "parts": ds.num_parts}, "fanout": FANOUT,
           "batch_size": args.batch_size, "threads": 1,
           "ours": {"edges_per_s": ours[0], "batches_per_s": ours[1]},
           "ours_unpacked": {"edges_per_s": unpacked[0], "batches_per_s": unpacked[1]},
           "ours_per_hop_driver": {"edges_per_s": per_hop[0], "batches_per_s": per_hop[1]},
           "ours_with_features": {"edges_per_s": with_features, "batches_per_s": loader_bps},
           "loader_batches_per_s_by_workers": {0: loader_bps, **workers},
           "disjoint_loader_batches_per_s_by_workers": disjoint_workers,
           "torch_reference": {"edges_per_s": ref[0], "batches_per_s": ref[1]},
           "pyg_lib": _pyglib(ds, draw)}
    out["speedup_vs_torch_reference"] = ours[0] / ref[0]
    if out["pyg_lib"]:
        out["speedup_vs_pyg_lib"] = ours[0] / out["pyg_lib"]["edges_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "products")
    parser.add_argument("--spec", default=PRODUCTS)
    parser.add_argument("--parts", type=toolargs.count, default=4)
    parser.add_argument("--batches", type=toolargs.count, default=30)
    parser.add_argument("--repeats", type=toolargs.count, default=3,
                        help="passes over the batches; the median is reported")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--workers", type=toolargs.count, default=2, help="DataLoader workers compared with 0")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    info = benchinfo.start(args, args.json)
    out = {**info, **run(args)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    benchinfo.record("bench_sampler", args, out, {"spec": args.spec, "parts": args.parts})
    return 0


def _print(out: dict) -> None:
    g = out["graph"]
    print(f"graph: {g['nodes']:,} nodes, {g['edges']:,} edges, {g['parts']} partitions; fanout {FANOUT}, "
          f"batch {out['batch_size']}, 1 thread")
    for name in ("ours", "ours_unpacked", "ours_per_hop_driver", "ours_with_features", "torch_reference", "pyg_lib"):
        r = out[name]
        if r:
            print(f"  {name:<20} {r['edges_per_s'] / 1e6:8.2f} M sampled edges/s  {r['batches_per_s']:8.2f} batches/s")
    by_workers = out["loader_batches_per_s_by_workers"]
    print("  NeighborLoader batches/s by num_workers: "
          + ", ".join(f"{w}: {bps:.2f}" for w, bps in by_workers.items()))
    print("  NeighborLoader(disjoint=True) batches/s by num_workers: "
          + ", ".join(f"{w}: {bps:.2f}" for w, bps in out["disjoint_loader_batches_per_s_by_workers"].items()))
    print(f"  speed-up vs torch reference: {out['speedup_vs_torch_reference']:.1f}x"
          + (f", vs pyg-lib: {out['speedup_vs_pyg_lib']:.2f}x" if "speedup_vs_pyg_lib" in out else ""))


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
