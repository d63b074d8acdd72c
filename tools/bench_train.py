"""Benchmark distributed training: epoch time, per-step split, peak memory per rank; loader-only; A/B against a checkout.

Usage::

    python tools/bench_train.py [--json] [--ranks 1,2,4] [--case homo|hetero|infer|onepart|compare] [--epochs 2]
                                [--spec SPEC] [--fanout 10,5] [--batch-size 1024] [--hidden 128] [--seed S]
                                [--data DIR] [--baseline-tree PATH] [--repeats 1]

Each rank count N trains on the ``--spec`` graph ingested into N METIS partitions (once, cached under
--data) with ``graphstore-train --nproc N``. Per run: training seconds (the last epoch; the first includes
numba compilation and page-cache warm-up), epoch seconds with evaluation, the timing breakdown, per step
the seconds waiting for data and computing (forward, backward, optimizer), remote requests per step,
and the peak resident set of every rank (polled by this tool every 0.1 s, so a checkout without its own
peak report is measured the same way), and a loader-only pass (``--loader-only``: the distributed loader
iterated with no model: batches/s per rank, the rate a model would be fed).

``--case compare`` runs, on the first rank count, this checkout (its ranks under jemalloc where the
machine has it), this checkout with ``GRAPHSTORE_MALLOC=glibc`` (glibc tuned) and with
``GRAPHSTORE_MALLOC=default`` (no tuning), and (with ``--baseline-tree PATH``, e.g. a ``git worktree`` of main) that
checkout, each in a child process with ``PYTHONPATH=PATH``, interleaved ``--repeats`` times, since
absolute times drift between runs on a shared machine. ``--spec pairs:nodes=N,pairs=P,features=F,
classes=C,seed=S`` generates P random node pairs, made undirected (2P directed edges), F random features,
C random classes, 10/10/10% train/val/test, as an ``npz:`` source (cached under --data).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = "synthetic:nodes=200000,avg_degree=15,features=64,classes=10,train=0.2,val=0.05,seed=0"
HETERO_SPEC = "synthetic-mag:papers=50000,classes=32,features=64,seed=0"


def pairs_graph(spec: str, data: Path) -> str:
    """The ``npz:`` source of a ``pairs:`` spec, generated on first use."""
    opts = dict(kv.split("=") for kv in spec[len("pairs:"):].split(","))
    n, pairs, feats = int(opts["nodes"]), int(opts["pairs"]), int(opts.get("features", 100))
    classes, seed = int(opts.get("classes", 47)), int(opts.get("seed", 0))
    path = data / f"pairs-{n}-{pairs}-{feats}-{classes}-{seed}.npz"
    if not path.exists():
        rng = np.random.default_rng(seed)
        a, b = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
        perm, masks = rng.permutation(n), {}
        for i, name in enumerate(("train_mask", "val_mask", "test_mask")):
            masks[name] = np.zeros(n, bool)
            masks[name][perm[i * n // 10:(i + 1) * n // 10]] = True
        data.mkdir(parents=True, exist_ok=True)
        np.savez(path, edge_index=np.stack([np.concatenate([a, b]), np.concatenate([b, a])]),
                 x=rng.standard_normal((n, feats), dtype=np.float32), y=rng.integers(0, classes, n), **masks)
    return f"npz:{path}"


def dataset(args: argparse.Namespace, ranks: int) -> Path:
    spec = HETERO_SPEC if args.case == "hetero" else args.spec
    source = pairs_graph(spec, args.data) if spec.startswith("pairs:") else spec
    return benchinfo.ingested(args.data / args.case, source, 1 if args.case == "onepart" else ranks)


def run_job(tree: Path, dest: Path, ranks: int, args: argparse.Namespace, seed: int, extra: list[str],
            env: dict[str, str] | None = None) -> dict:
    """``graphstore-train`` of checkout ``tree`` in a child process; its metrics, output and polled peaks."""
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        metrics = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "training.launch", str(dest), "--nproc", str(ranks), "--epochs",
               str(args.epochs), "--fanout", args.fanout, "--batch-size", str(args.batch_size), "--hidden",
               str(args.hidden), "--no-progress", "--metrics-out", str(metrics), "--seed", str(seed), *extra]
        with open(Path(tmp) / "out", "w+") as out, open(Path(tmp) / "err", "w+") as err:
            proc = subprocess.Popen(cmd, cwd=tree, stdout=out, stderr=err, text=True,
                                    env={**os.environ, "PYTHONPATH": str(tree), **(env or {})})
            started = time.perf_counter()
            peaks = poll_peaks(proc, metrics)
            wall = time.perf_counter() - started
            out.seek(0), err.seek(0)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed in {tree}: {err.read()[-2000:]}")
            return {"doc": json.loads(metrics.read_text()), "peaks": peaks, "wall": wall, "stderr": err.read()}


def poll_peaks(proc: subprocess.Popen, metrics: Path, interval: float = 0.1) -> list[list[int]]:
    """Every rank's peak resident set (bytes) during each epoch: ``[epoch][rank]``, ranks in start order.
    An epoch ends when rank 0 writes it to the metrics file (after its evaluation and checkpoint); epochs
    that end within one poll (short epochs, a busy machine) share that poll's window and its peaks, as does
    an epoch that ends after the last poll."""
    import psutil

    per_epoch: list[dict[int, int]] = [{}]
    written = 0
    while proc.poll() is None:
        try:
            ranks = benchinfo.rank_processes(proc.pid)
            rss = {r.pid: r.memory_info().rss for r in ranks}
        except psutil.Error:
            rss = {}
        for pid, value in rss.items():
            per_epoch[-1][pid] = max(per_epoch[-1].get(pid, 0), value)
        count = _epochs_written(metrics)
        if count is not None and count > written:
            per_epoch.extend(dict(per_epoch[-1]) for _ in range(count - written - 1))
            per_epoch.append({})
            written = count
        time.sleep(interval)
    count = _epochs_written(metrics) or written  # the job has ended: every epoch it wrote, none in progress
    while len(per_epoch) < count:
        per_epoch.append({})
    windows: list[dict[int, int]] = []
    for window in per_epoch[:count] or per_epoch:  # a window no poll fell in shares the one before it
        windows.append(window or (windows[-1] if windows else window))
    return [[w[p] for p in sorted(w)] for w in windows if w]


def _epochs_written(metrics: Path) -> int | None:
    """How many epochs the metrics file holds (``None`` while it is absent or being written)."""
    try:
        return len(json.loads(metrics.read_text())["epochs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def summarize(job: dict, ranks: int) -> dict:
    """What a table row shows: the last epoch, medians over epochs after the first, peaks per rank."""
    epochs = job["doc"]["epochs"]
    later = epochs[1:] or epochs
    last, peaks = epochs[-1], job["peaks"][:len(epochs)]  # what follows the last epoch is shutdown
    steps = max(1, last["steps"])

    def per_step(e: dict, keys: tuple[str, ...]) -> float:
        return sum(e["timing"].get(k, 0.0) for k in keys) / max(1, e["steps"])

    largest = [max(p) for p in peaks]
    row = {"ranks": ranks, "epochs": len(epochs), "steps": last["steps"],
           "train_seconds": [e["train_seconds"] for e in epochs], "epoch_seconds": [e["epoch_seconds"] for e in epochs],
           "train_seconds_median": _median([e["train_seconds"] for e in later]),
           "data_wait_per_step": _median([per_step(e, ("data_wait",)) for e in later]),
           "compute_per_step": _median([per_step(e, ("forward_backward", "optimizer")) for e in later]),
           "timing": last["timing"], "remote_requests": last["remote"]["requests"],
           "remote_requests_per_step": round(last["remote"]["requests"] / (steps * ranks), 2),
           "peak_rss_mb_per_epoch": [[round(b / 2**20) for b in p] for p in peaks],
           "peak_rss_mb_largest": round(max(largest) / 2**20) if largest else None,
           "peak_growth_after_epoch_2": round(max(largest) / max(largest[:2]), 3) if len(largest) > 2 else None,
           "memory_mb": last.get("memory_mb"), "test_acc": last.get("test_acc"),
           "allocator": last.get("allocator", "not reported")}
    if "loader_batches_per_s" in last:
        row["loader_batches_per_s"] = [_median([e["loader_batches_per_s"][r] for e in later]) for r in range(ranks)]
    return row


def bench(ranks: int, args: argparse.Namespace) -> dict:
    dest = dataset(args, ranks)
    seed = _run_seed(args.seed, ranks)
    extra = ["--infer-out", f"bench_{int(time.time())}", "--model", "sage"] if args.case == "infer" else []
    job = run_job(ROOT, dest, ranks, args, seed, extra)
    row = {**summarize(job, ranks), "seed": seed, "parts": 1 if args.case == "onepart" else ranks}
    if args.case == "infer":
        row["inference"] = _inference_seconds(job["stderr"], _num_nodes(dest))
    elif args.case == "homo":
        row["loader_only"] = summarize(run_job(ROOT, dest, ranks, args, seed, ["--loader-only"]), ranks)
    return row


def _num_nodes(dest: Path) -> int:
    import graphstore

    return graphstore.open_dataset(dest).num_nodes()


def compare(args: argparse.Namespace) -> list[dict]:
    """This checkout, the default allocator and ``--baseline-tree``, interleaved; medians over repeats."""
    ranks = int(args.ranks.split(",")[0])
    dest = dataset(args, ranks)
    variants = [("this checkout", ROOT, [], {}),
                ("this checkout, GRAPHSTORE_MALLOC=glibc", ROOT, [], {"GRAPHSTORE_MALLOC": "glibc"}),
                ("this checkout, GRAPHSTORE_MALLOC=default", ROOT, [], {"GRAPHSTORE_MALLOC": "default"})]
    if args.baseline_tree:
        variants.insert(0, (f"baseline {args.baseline_tree}", Path(args.baseline_tree).resolve(), [], {}))
    variants.append(("this checkout, --loader-only", ROOT, ["--loader-only"], {}))
    runs: dict[str, list[dict]] = {name: [] for name, *_ in variants}
    for repeat in range(args.repeats):
        seed = _run_seed(args.seed, ranks, repeat)
        for name, tree, extra, env in variants:
            print(f"repeat {repeat + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
            runs[name].append({**summarize(run_job(tree, dest, ranks, args, seed, extra, env), ranks), "seed": seed})
    base = runs[variants[0][0]]
    out = []
    for name, tree, *_ in variants:
        rows = runs[name]
        ratio = [b["train_seconds_median"] / r["train_seconds_median"] for b, r in zip(base, rows)]
        out.append({"variant": name, "tree": str(tree), "runs": rows, "speed_vs_first": _median(ratio),
                    "train_seconds_median": _median([r["train_seconds_median"] for r in rows]),
                    "peak_rss_mb_largest": max(r["peak_rss_mb_largest"] for r in rows)})
    return out


def _run_seed(seed: int, ranks: int, repeat: int = 0) -> int:
    """A fresh training seed per run (shuffle order, sampled neighbours, initial weights)."""
    return int(benchinfo.rng(seed, ranks, *([repeat] if repeat else [])).integers(0, 2**31))


def _inference_seconds(stderr: str, nodes: int) -> dict:
    """Inference seconds as the trainer logged them (``wrote NAME for N nodes ... in S s``)."""
    import re

    match = re.search(r"wrote \S+ for (\d+) nodes into \S+ in ([\d.]+) s", stderr)
    seconds = float(match.group(2)) if match else float("nan")
    return {"nodes": nodes, "seconds": seconds, "nodes_per_s": round(nodes / seconds, 1) if match else None}


def _pyg_note() -> str:
    try:
        import pyg_lib  # noqa: F401
        return "pyg-lib is installed, but the PyG distributed comparison is not implemented in this tool yet"
    except ImportError:
        return "pyg-lib is not installed here: PyG's torch_geometric.distributed cannot sample; comparison skipped"


def _gb(mb: float | None) -> str:
    return "?" if mb is None else f"{mb / 1024:.2f}"


def print_runs(rows: list[dict], args: argparse.Namespace) -> None:
    spec = HETERO_SPEC if args.case == "hetero" else args.spec
    print(f"{spec} ({args.case}), fanout {args.fanout}, batch {args.batch_size}, hidden {args.hidden}; "
          f"{args.epochs} epochs (training s: the last; per step: medians of epochs 2+)")
    base = rows[0]["train_seconds"][-1]
    for r in rows:
        loader = r.get("loader_only", {}).get("loader_batches_per_s")
        print(f"  {r['ranks']} rank(s): training {r['train_seconds'][-1]:6.1f} s (x{base / r['train_seconds'][-1]:.2f} "
              f"vs {rows[0]['ranks']}; epoch with evaluation {r['epoch_seconds'][-1]:.1f} s), {r['steps']} steps/rank; "
              f"per step: data wait {r['data_wait_per_step']:.3f} s, compute {r['compute_per_step']:.3f} s; peak RSS "
              f"of the largest rank {_gb(r['peak_rss_mb_largest'])} GiB; {r['remote_requests_per_step']} remote "
              f"requests/step; test acc {r['test_acc']}"
              + (f"; loader only: {loader} batches/s per rank" if loader else "")
              + (f"; inference {r['inference']['nodes_per_s']} nodes/s" if "inference" in r else ""))


def print_compare(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"{args.spec}, {args.ranks.split(',')[0]} ranks, fanout {args.fanout}, batch {args.batch_size}, hidden "
          f"{args.hidden}, {args.epochs} epochs, {args.repeats} repeat(s) interleaved; seconds: medians of epochs 2+")
    print("| variant | training s/epoch | speed vs first | data wait/step | compute/step | peak RSS, largest rank "
          "(GiB): epochs 1-2 / all | growth after epoch 2 | loader batches/s per rank |")
    print("|---|---|---|---|---|---|---|---|")
    for v in rows:
        r = v["runs"][-1]
        peaks = [max(p) for p in r["peak_rss_mb_per_epoch"]]
        loader = r.get("loader_batches_per_s")
        print(f"| {v['variant']} ({r['allocator']}) | {v['train_seconds_median']:.1f} | {v['speed_vs_first']:.2f} | "
              f"{r['data_wait_per_step']:.3f} | {r['compute_per_step']:.3f} | {_gb(max(peaks[:2]))} / "
              f"{_gb(max(peaks))} | {r['peak_growth_after_epoch_2']} | {', '.join(map(str, loader or [])) or '-'} |")
    for v in rows:
        for r in v["runs"]:
            print(f"{v['variant']} (seed {r['seed']}): training s per epoch {r['train_seconds']}; peak RSS MB per "
                  f"epoch and rank {r['peak_rss_mb_per_epoch']}")


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ranks", type=toolargs.counts, default="1,2,4")
    parser.add_argument("--case", choices=("homo", "hetero", "infer", "onepart", "compare"), default="homo",
                        help="homogeneous training on N partitions for N ranks (default), the mag-shaped "
                             "heterogeneous graph, training then layer-wise inference written into the dataset "
                             "(nodes/s), N ranks on ONE partition (plain data parallelism, shared pages), or "
                             "this checkout against --baseline-tree and the default allocator")
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--epochs", type=toolargs.count, default=2)
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--hidden", type=toolargs.count, default=128)
    parser.add_argument("--baseline-tree", help="--case compare: a checkout to compare with (e.g. of main)")
    parser.add_argument("--repeats", type=toolargs.count, default=1, help="--case compare: interleaved repeats")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "train")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    if args.baseline_tree and args.case != "compare":
        parser.error("--baseline-tree is for --case compare")
    run_info = benchinfo.start(args, args.json)
    print(_pyg_note(), file=sys.stderr)
    rows = compare(args) if args.case == "compare" else [bench(int(r), args) for r in args.ranks.split(",")]
    spec = HETERO_SPEC if args.case == "hetero" else args.spec
    out = {**run_info, "spec": spec, "case": args.case, "fanout": args.fanout, "hidden": args.hidden,
           "batch_size": args.batch_size, "runs" if args.case != "compare" else "variants": rows}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        (print_compare if args.case == "compare" else print_runs)(rows, args)
    benchinfo.record("bench_train", args, out, {"case": args.case, "spec": spec, "ranks": args.ranks})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
