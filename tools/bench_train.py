"""Benchmark distributed training: epoch time and its breakdown for 1, 2 and 4 ranks on one machine.

Usage::

    python tools/bench_train.py [--json] [--ranks 1,2,4] [--case homo|hetero|infer|onepart] [--epochs 2] [--seed S]
                                [--data DIR]

Each rank count N trains on the same synthetic graph ingested into N METIS partitions (once, cached
under --data) with ``graphstore-train --nproc N``; the last epoch's figures are reported (the first
includes numba compilation and page-cache warm-up): training seconds (the speed-up is computed on
these), epoch seconds with evaluation, the per-rank timing breakdown, remote requests per training
step and resident memory per rank. Each run trains with a fresh ``--seed`` (derived from this
tool's ``--seed``, printed with the machine). PyG's
``torch_geometric.distributed`` needs pyg-lib for its sampler, so the comparison with it is skipped
with a message when pyg-lib is not installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import graphstore
from training.timing import describe

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)

SPEC = "synthetic:nodes=200000,avg_degree=15,features=64,classes=10,train=0.2,val=0.05,seed=0"
HETERO_SPEC = "synthetic-mag:papers=50000,classes=32,features=64,seed=0"


def bench(ranks: int, args: argparse.Namespace) -> dict:
    spec = HETERO_SPEC if args.case == "hetero" else args.spec
    dest = benchinfo.ingested(args.data / args.case, spec, 1 if args.case == "onepart" else ranks)
    metrics = args.data / f"metrics-{args.case}-{ranks}.json"
    cmd = [sys.executable, "-m", "training.launch", str(dest), "--nproc", str(ranks), "--epochs", str(args.epochs),
           "--fanout", args.fanout, "--batch-size", str(args.batch_size), "--no-progress", "--metrics-out", str(metrics),
           "--seed", str(_run_seed(args.seed, ranks))]
    if args.case == "infer":  # a fresh name each run: outputs are added to the dataset
        cmd += ["--infer-out", f"bench_{int(time.time())}", "--model", "sage"]
    started = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    last = json.loads(metrics.read_text())["epochs"][-1]
    if args.case == "infer":
        last["inference"] = _inference_seconds(done.stderr, graphstore.open_dataset(dest).num_nodes(), wall)
    return {"ranks": ranks, "seed": _run_seed(args.seed, ranks), "epoch_seconds": last["epoch_seconds"], "train_seconds": last["train_seconds"],
            "steps": last["steps"], "memory_mb": last.get("memory_mb"), "parts": 1 if args.case == "onepart" else ranks,
            "timing": last["timing"], "remote_requests": last["remote"]["requests"],
            "remote_requests_per_step": round(last["remote"]["requests"] / max(1, last["steps"] * ranks), 2),
            "test_acc": last.get("test_acc"), **({"inference": last["inference"]} if "inference" in last else {})}


def _run_seed(seed: int, ranks: int) -> int:
    """A fresh training seed per run (shuffle order, sampled neighbours, initial weights)."""
    return int(benchinfo.rng(seed, ranks).integers(0, 2**31))


def _inference_seconds(stderr: str, nodes: int, wall: float) -> dict:
    """Inference seconds as the trainer logged them (``wrote NAME for N nodes ... in S s``)."""
    import re

    match = re.search(r"wrote \S+ for (\d+) nodes into \S+ in ([\d.]+) s", stderr)
    seconds = float(match.group(2)) if match else float("nan")
    return {"nodes": nodes, "seconds": seconds, "nodes_per_s": round(nodes / seconds, 1) if match else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--case", choices=("homo", "hetero", "infer", "onepart"), default="homo",
                        help="homogeneous training on N partitions for N ranks (default), the mag-shaped "
                             "heterogeneous graph, training then layer-wise inference written into the dataset "
                             "(nodes/s), or N ranks on ONE partition (plain data parallelism, shared pages)")
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fanout", default="10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "train")
    benchinfo.add_seed_argument(parser)
    args = parser.parse_args(argv)
    run_info = benchinfo.start(args, args.json)
    try:
        import pyg_lib  # noqa: F401
        note = "pyg-lib is installed, but the PyG distributed comparison is not implemented in this tool yet"
    except ImportError:
        note = "pyg-lib is not installed here: PyG's torch_geometric.distributed cannot sample; comparison skipped"
    print(note, file=sys.stderr)
    rows = [bench(int(r), args) for r in args.ranks.split(",")]
    base = rows[0]["train_seconds"]
    for row in rows:
        row["speedup_vs_first"] = round(base / row["train_seconds"], 2)
    if args.json:
        print(json.dumps({**run_info, "spec": HETERO_SPEC if args.case == "hetero" else args.spec, "case": args.case, "fanout": args.fanout, "batch_size": args.batch_size, "runs": rows,
                          "pyg_distributed": note}, indent=2))
        return 0
    spec = HETERO_SPEC if args.case == "hetero" else args.spec
    print(f"{spec} ({args.case}), fanout {args.fanout}, batch {args.batch_size}; last of {args.epochs} epochs")
    for r in rows:
        t = r["timing"]
        mem = r["memory_mb"] or {}
        print(f"  {r['ranks']} rank(s): training {r['train_seconds']:6.1f} s (x{r['speedup_vs_first']} vs "
              f"{rows[0]['ranks']}; epoch with evaluation {r['epoch_seconds']:.1f} s), {r['steps']} steps/rank; "
              f"RSS/rank {mem.get('rss')} MB; {describe(t, r['train_seconds'])}; "
              f"{r['remote_requests_per_step']} remote requests/step; test acc {r['test_acc']}"
              + (f"; inference {r['inference']['nodes_per_s']} nodes/s" if "inference" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
