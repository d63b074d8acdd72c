"""Per-step forward+backward time of the built-in models: untrimmed, trimmed by PyG's trim_to_layer, and in
blocks (graphstore's: each layer computes only the rows the next one reads), on one process.

    .venv/bin/python tools/bench_trim.py          # 20k-node skewed synthetic graph, batch 512, two shapes
    .venv/bin/python tools/bench_trim.py --nodes 5000 --steps 5 --shapes 64:15,10,5

Shapes are ``FEATURES:FANOUT`` (default ``64:15,10,5`` and ``1024:10,5``: narrow rows and deep hops, wide
rows and two hops). Batches come from ``sampling.NeighborLoader`` over an in-memory graph and are drawn
once per shape; each model then runs the same batches in the three ways, alternating, and the median
step time is printed with each way's speed-up over the untrimmed model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn.models.basic_gnn import BasicGNN

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


WAYS = ("untrimmed", "trimmed", "blocks")
SHAPES = "64:15,10,5;1024:10,5"  # narrow rows and deep hops, wide rows and two hops


def step_seconds(model: torch.nn.Module, batch: Data, name: str, way: str) -> float:
    trim = trim_arguments(name, batch) if way != "untrimmed" else {}
    forward = model if way == "blocks" else partial(BasicGNN.forward, model)  # PyG's own forward
    start = time.perf_counter()
    out = forward(batch.x, batch.edge_index, **trim)[: batch.batch_size]
    F.cross_entropy(out, batch.y[: batch.batch_size]).backward()
    return time.perf_counter() - start


def main() -> None:
    ap = toolargs.parser(__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=toolargs.count, default=20_000)
    ap.add_argument("--steps", type=toolargs.count, default=8)
    ap.add_argument("--batch-size", type=toolargs.count, default=512)
    ap.add_argument("--hidden", type=toolargs.count, default=128)
    ap.add_argument("--shapes", default=SHAPES, help=f"FEATURES:FANOUT shapes, separated by ';' (default: {SHAPES})")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    benchinfo.add_seed_argument(ap)
    benchinfo.add_record_arguments(ap)
    args = ap.parse_args()
    shapes = _shapes(ap, args.shapes)
    result = benchinfo.start(args, args.json)
    rows = []
    header = (f"# {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads; {args.nodes} nodes, batch {args.batch_size}, "
              f"hidden {args.hidden}, {args.steps} steps")
    if not args.json:
        print(header + "\n| features | fanout | model | untrimmed ms/step | trimmed ms/step | blocks ms/step "
              "| trimmed speed-up | blocks speed-up |\n|---|---|---|---|---|---|---|---|")
    for features, fanout in shapes:
        torch.manual_seed(args.seed)  # fresh batches (shuffle, neighbours) and weights per run unless --seed
        data = graph(args.nodes, features)
        loader = NeighborLoader(data, fanout, batch_size=args.batch_size, shuffle=True, seed=args.seed)
        batches = [b for _, b in zip(range(args.steps), loader)]
        for name in TRIMMED_MODELS:
            model = build_model(name, features, args.hidden, 8, len(fanout), 0.0)
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            for way in WAYS:
                step_seconds(model, batches[0], name, way)  # warm-up
            for i, batch in enumerate(batches):
                for way in WAYS[i % 3:] + WAYS[: i % 3]:  # each way first as often as the others
                    times[way].append(step_seconds(model, batch, name, way))
            ms = {way: 1e3 * statistics.median(times[way]) for way in WAYS}
            rows.append({"features": features, "fanout": fanout, "model": name,
                         **{f"{way}_ms": round(ms[way], 2) for way in WAYS}})
            if not args.json:
                print(f"| {features} | {','.join(map(str, fanout))} | {name} | {ms['untrimmed']:.1f} | "
                      f"{ms['trimmed']:.1f} | {ms['blocks']:.1f} | {ms['untrimmed'] / ms['trimmed']:.2f}x | "
                      f"{ms['untrimmed'] / ms['blocks']:.2f}x |", flush=True)
    if args.json:
        print(json.dumps({**result, "setup": header[2:], "rows": rows}, indent=1))
    benchinfo.record("bench_trim", args, {**result, "setup": header[2:], "rows": rows},
                     {"nodes": args.nodes, "batch_size": args.batch_size, "hidden": args.hidden,
                      **({"shapes": args.shapes} if args.shapes != SHAPES else {})})


def _shapes(ap: argparse.ArgumentParser, text: str) -> list[tuple[int, list[int]]]:
    out = []
    for part in filter(None, text.split(";")):
        features, _, fanout = part.partition(":")
        try:
            out.append((toolargs.count(features), [int(h) for h in toolargs.fanout(fanout).split(",")]))
        except (ValueError, argparse.ArgumentTypeError):
            ap.error(f"--shapes: {part!r} is not FEATURES:FANOUT (for example 64:15,10,5)")
    if not out:
        ap.error("--shapes: give at least one FEATURES:FANOUT (for example 64:15,10,5)")
    return out


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
