"""Benchmark the store: random-row gather vs an in-RAM numpy fancy index, and ingest time / peak memory.

Usage::

    python tools/bench_store.py [--json] [--nodes N] [--features F] [--repeats 7] [--seed S] [--data DIR]
    python tools/bench_store.py --ingest "synthetic:nodes=2400000,avg_degree=52,features=100,classes=47" --parts 4

The gather part ingests (once, cached under --data) a synthetic graph, opens partition 0, and for
batches of 1,024 to 100,000 random own IDs (fresh ones for every call and repeat, the same ones
for the three variants within a repeat; ``--seed`` to draw them again) times ``feature_store[None, "x", ids]`` against
``x_in_ram[ids]`` on a copy of the same rows in RAM, in the same process, page cache warm. It prints
the speed ratio (in-RAM time / store time; 1.0 = as fast as RAM), against numpy fancy indexing
and, stricter, against ``torch.index_select`` on the in-RAM copy (what the store itself uses). ``--ingest SPEC`` runs
``graphstore ingest SPEC`` in a child process and reports its seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import graphstore
from graphstore.errors import DatasetNotFoundError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402
from benchinfo import rng  # noqa: E402

BATCHES = (1024, 10_000, 100_000)


def _calls_per_sample(fn, ids: np.ndarray) -> int:
    """Calls per timed sample so a sample lasts ~20 ms (timer noise); the call also warms the path."""
    start = time.perf_counter()
    fn(ids)
    return max(1, int(0.02 / max(time.perf_counter() - start, 1e-7)))


def _time_calls(fn, id_sets: list) -> float:
    """Seconds per call of ``fn`` over ``id_sets`` (one call per set)."""
    start = time.perf_counter()
    for ids in id_sets:
        fn(ids)
    return (time.perf_counter() - start) / len(id_sets)


def _dataset(data: Path, nodes: int, features: int) -> graphstore.Dataset:
    try:
        return graphstore.open_dataset(data)
    except DatasetNotFoundError:
        spec = f"synthetic:nodes={nodes},avg_degree=4,features={features},classes=8,seed=0"
        print(f"ingesting {spec} into {data} (once)", file=sys.stderr)
        graphstore.ingest(spec, data, num_parts=2, method="range", parents=True)
        return graphstore.open_dataset(data)


def bench_gather(data: Path, nodes: int, features: int, repeats: int, seed: int) -> list[dict]:
    """Per batch size, ``repeats`` samples; each sample draws fresh random own IDs (one set per call, so
    no call re-reads the rows the previous one left in the CPU cache), shared by the three variants."""
    ds = _dataset(data, nodes, features)
    fs, gs = ds.partition(0)
    lo, hi = gs.dst_range()
    x_ram = np.array(fs[None, "x", None].numpy())  # an in-RAM copy of the same rows
    x_ram_t = torch.from_numpy(x_ram)
    variants = {"ram": lambda ids: x_ram[ids[0]], "ram_torch": lambda ids: x_ram_t.index_select(0, ids[1]),
                "store": lambda ids: fs[None, "x", ids[2]]}
    rows = []
    for batch in BATCHES:
        def draw(*keys: int) -> tuple:
            ids = rng(seed, batch, *keys).integers(lo, hi, batch)
            return ids - lo, torch.from_numpy(ids - lo), torch.from_numpy(ids)

        check = draw(0, 0)
        assert np.array_equal(fs[None, "x", check[2]].numpy(), x_ram[check[0]])  # same rows, or timing means nothing
        number = max(_calls_per_sample(fn, draw(0, 1)) for fn in variants.values())
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(repeats):
            id_sets = [draw(1 + r, i) for i in range(number)]  # fresh IDs per repeat and per call
            for name, fn in variants.items():
                samples[name].append(_time_calls(fn, id_sets))
        t_ram, t_ram_torch, t_store = (float(np.median(samples[k])) for k in ("ram", "ram_torch", "store"))
        rows.append({"batch": batch, "features": int(x_ram.shape[1]), "calls_per_sample": number,
                     "ram_ms": 1e3 * t_ram, "ram_torch_ms": 1e3 * t_ram_torch, "store_ms": 1e3 * t_store,
                     "speed_vs_ram": t_ram / t_store, "speed_vs_ram_torch": t_ram_torch / t_store,
                     "store_rows_per_s": batch / t_store})
    return rows


def bench_ingest(spec: str, parts: int, method: str, dest: Path) -> dict:
    cmd = [sys.executable, "-m", "graphstore.cli.app", "ingest", spec, str(dest), "--parts", str(parts),
           "--method", method, "--overwrite", "--parents", "--json"]
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    summary = json.loads(out.stdout)
    return {"spec": spec, "parts": parts, "method": method, "seconds": seconds, "peak_rss_gb": peak_kb / 2**20,
            "edge_cut_fraction": summary["edge_cut_fraction"], "node_balance": summary["node_balance"],
            "edge_balance": summary["edge_balance"], "bytes_written_gb": summary["bytes_written"] / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=toolargs.count, default=1_000_000)
    parser.add_argument("--features", type=toolargs.count, default=100)
    parser.add_argument("--repeats", type=toolargs.count, default=7)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "gather")
    parser.add_argument("--ingest", metavar="SPEC", help="also time `graphstore ingest SPEC` (child process)")
    parser.add_argument("--parts", type=toolargs.count, default=4)
    parser.add_argument("--method", default="metis")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    result = benchinfo.start(args, args.json)
    result["gather"] = bench_gather(args.data / f"n{args.nodes}_f{args.features}", args.nodes, args.features,
                                    args.repeats, args.seed)
    if args.ingest:
        result["ingest"] = bench_ingest(args.ingest, args.parts, args.method, args.data / "ingest")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result, args)
    benchinfo.record("bench_store", args, result, {"nodes": args.nodes, "features": args.features})
    return 0


def _print(result: dict, args: argparse.Namespace) -> None:
    print(f"random-row gather, page cache warm, fresh random IDs per call and repeat ({args.repeats} repeats, "
          "median); speed = in-RAM time / store time (1.0 = as fast as RAM)")
    for row in result["gather"]:
        print(f"  batch {row['batch']:>7,} x {row['features']} float32: RAM numpy {row['ram_ms']:8.3f} ms, "
              f"RAM torch {row['ram_torch_ms']:8.3f} ms, store {row['store_ms']:8.3f} ms; speed vs numpy "
              f"{row['speed_vs_ram']:.2f}, vs torch {row['speed_vs_ram_torch']:.2f}")
    if args.ingest:
        r = result["ingest"]
        print(f"ingest {r['spec']} into {r['parts']} {r['method']} partitions: {r['seconds']:.0f} s, peak RSS "
              f"{r['peak_rss_gb']:.1f} GB, edge cut {100 * r['edge_cut_fraction']:.1f}%, balance nodes "
              f"{r['node_balance']} edges {r['edge_balance']}, {r['bytes_written_gb']:.2f} GB written")


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
