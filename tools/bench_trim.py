"""Per-step forward+backward time of the built-in models with and without trim_to_layer, on one process.

    .venv/bin/python tools/bench_trim.py                      # 20k-node synthetic graph, [15,10,5], batch 512
    .venv/bin/python tools/bench_trim.py --nodes 5000 --steps 5

Batches come from ``sampling.NeighborLoader`` over an in-memory graph and are drawn once; each model
then runs the same batches untrimmed and trimmed, alternating, and the median step time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from graphstore.ingest.synthetic import parse_synthetic_spec
from graphstore.ingest.synthetic_chunks import synthetic_graph
from sampling import NeighborLoader
from training.loop.tasks import TRIMMED_MODELS, build_model, trim_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402


def graph(nodes: int, features: int) -> Data:
    g = synthetic_graph(parse_synthetic_spec(f"nodes={nodes},avg_degree=10,features={features},classes=8"))
    table = g.nodes[None]
    every = torch.arange(nodes).numpy()
    return Data(x=torch.from_numpy(table.attrs["x"].take(every)).float(),
                y=torch.from_numpy(table.attrs["y"].take(every)),
                edge_index=torch.stack([torch.from_numpy(g.edges[None].src), torch.from_numpy(g.edges[None].dst)]))


def step_seconds(model: torch.nn.Module, batch: Data, trim: dict) -> float:
    start = time.perf_counter()
    out = model(batch.x, batch.edge_index, **trim)[: batch.batch_size]
    F.cross_entropy(out, batch.y[: batch.batch_size]).backward()
    return time.perf_counter() - start


def main() -> None:
    ap = toolargs.parser(__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=toolargs.count, default=20_000)
    ap.add_argument("--steps", type=toolargs.count, default=8)
    ap.add_argument("--batch-size", type=toolargs.count, default=512)
    ap.add_argument("--hidden", type=toolargs.count, default=128)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    benchinfo.add_seed_argument(ap)
    benchinfo.add_record_arguments(ap)
    args = ap.parse_args()
    result = benchinfo.start(args, args.json)
    torch.manual_seed(args.seed)  # fresh batches (shuffle, neighbours) and weights per run unless --seed
    data = graph(args.nodes, 64)
    loader = NeighborLoader(data, [15, 10, 5], batch_size=args.batch_size, shuffle=True, seed=args.seed)
    batches = [b for _, b in zip(range(args.steps), loader)]
    rows = []
    header = (f"# {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads; {args.nodes} nodes, fanout [15,10,5], batch {args.batch_size}, "
              f"hidden {args.hidden}, {args.steps} steps")
    if not args.json:
        print(header + "\n| model | untrimmed ms/step | trimmed ms/step | speed-up |\n|---|---|---|---|")
    for name in TRIMMED_MODELS:
        model = build_model(name, 64, args.hidden, 8, 3, 0.0)
        times: dict[bool, list[float]] = {False: [], True: []}
        step_seconds(model, batches[0], {})  # warm-up
        for batch in batches:
            for trimmed in (False, True):
                times[trimmed].append(step_seconds(model, batch, trim_arguments(name, batch) if trimmed else {}))
        full, trim = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"model": name, "untrimmed_ms": round(1e3 * full, 2), "trimmed_ms": round(1e3 * trim, 2)})
        if not args.json:
            print(f"| {name} | {1e3 * full:.1f} | {1e3 * trim:.1f} | {full / trim:.2f}x |", flush=True)
    if args.json:
        print(json.dumps({**result, "setup": header[2:], "rows": rows}, indent=1))
    benchinfo.record("bench_trim", args, {**result, "setup": header[2:], "rows": rows},
                     {"nodes": args.nodes, "batch_size": args.batch_size, "hidden": args.hidden})


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
