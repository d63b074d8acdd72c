"""How long a training rank waits for data: graphstore-train, end to end, under several loader settings.

Usage::

    python tools/bench_data_wait.py [--spec SPEC] [--parts 1] [--nproc 1] [--device cuda] [--epochs 4]
                                    [--repeats 2] [--data DIR] [--way NAME=FLAGS ...] [--json]

Each ``--way NAME="FLAGS"`` is one loader setting (default: the rank's threads, and 1, 2, 4 and 8 sampler
processes); every way trains the same dataset with the same flags (issue 27's: ``--model sage --hidden 256
--fanout 15,10,5 --batch-size 1024 --seed 1``), the ways interleaved ``--repeats`` times. Each run's
``--metrics-out`` gives, per epoch after the first (the first compiles kernels and warms the page cache),
the training seconds and the seconds the training loop waited for its next batch; the share is their ratio.
Printed per way: the median share, the median training seconds and the median forward/backward seconds,
with their ratio to the first way.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = "synthetic:nodes=100000,avg_degree=20,features=128,classes=10,seed=0"
FLAGS = ["--model", "sage", "--hidden", "256", "--fanout", "15,10,5", "--batch-size", "1024", "--seed", "1"]
WAYS = ["threads=", "p1=--loader-workers 1", "p2=--loader-workers 2", "p4=--loader-workers 4",
        "p8=--loader-workers 8"]


def _way(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=FLAGS, e.g. p2='--loader-workers 2'")
    return name, shlex.split(flags)


def train(dataset: Path, args: argparse.Namespace, flags: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "training.launch", str(dataset), "--no-progress", "--nproc", str(args.nproc),
           "--device", args.device, "--epochs", str(args.epochs), "--eval-every", str(args.epochs + 1),
           "--metrics-out", str(out), *FLAGS, *args.flags, *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, env=benchinfo.child_env(), cwd=ROOT, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"bench_data_wait: {shlex.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    every = json.loads(out.read_text())["epochs"]
    counted = every[1:]  # the first compiles kernels and warms the page cache
    return {"train_seconds": [e["train_seconds"] for e in counted],
            "data_wait": [e["timing"]["data_wait"] for e in counted],
            "forward_backward": [e["timing"]["forward_backward"] for e in counted],
            "loss": [e["loss"] for e in every]}


def run(args: argparse.Namespace) -> dict:
    dataset = benchinfo.ingested(args.data, args.spec, args.parts)
    runs: dict[str, list[dict]] = {name: [] for name, _ in args.way}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, flags in args.way:
                one = train(dataset, args, flags, Path(tmp) / f"{name}-{repeat}.json")
                runs[name].append(one)
                share = sum(one["data_wait"]) / max(1e-9, sum(one["train_seconds"]))
                print(f"  {name} (repeat {repeat + 1}): training {one['train_seconds']} s, data wait "
                      f"{one['data_wait']} s ({100 * share:.0f}%)", file=sys.stderr, flush=True)
    shares = {n: [w / t for r in rs for w, t in zip(r["data_wait"], r["train_seconds"])] for n, rs in runs.items()}
    train_s = {n: [t for r in rs for t in r["train_seconds"]] for n, rs in runs.items()}
    fwd = {n: [t for r in rs for t in r["forward_backward"]] for n, rs in runs.items()}
    first = args.way[0][0]
    med = {n: statistics.median(v) for n, v in train_s.items()}
    return {"spec": args.spec, "parts": args.parts, "nproc": args.nproc, "device": args.device,
            "flags": FLAGS + args.flags, "ways": {n: shlex.join(f) for n, f in args.way}, "runs": runs,
            "median_data_wait_share": {n: statistics.median(v) for n, v in shares.items()},
            "data_wait_share_range": {n: [min(v), max(v)] for n, v in shares.items()},
            "median_train_seconds": med, "train_seconds_ratio_to_first": {n: v / med[first] for n, v in med.items()},
            "median_forward_backward_seconds": {n: statistics.median(v) for n, v in fwd.items()},
            "same_losses": all(r["loss"] == runs[first][0]["loss"] for rs in runs.values() for r in rs)}


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--parts", type=toolargs.count, default=1)
    parser.add_argument("--nproc", type=toolargs.count, default=1)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--epochs", type=toolargs.integer(2), default=4, help="epochs a run (the first is not counted)")
    parser.add_argument("--repeats", type=toolargs.count, default=2, help="interleaved runs of every way")
    parser.add_argument("--way", type=_way, action="append", default=None, metavar="NAME=FLAGS",
                        help="a loader setting, e.g. p2='--loader-workers 2' (repeatable; the first is the baseline)")
    parser.add_argument("--flag", dest="flags", action="append", default=[], metavar="FLAG",
                        help="one more graphstore-train argument for every way (repeatable)")
    parser.add_argument("--timeout", type=toolargs.number(1), default=600, help="seconds a run may take")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "data-wait")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    args.way = args.way or [_way(w) for w in WAYS]
    info = benchinfo.start(args, args.json)
    out = {**info, **run(args)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['spec']}, {args.parts} partition(s), {args.nproc} rank(s) on {args.device}, "
              f"{shlex.join(out['flags'])}; epochs 2-{args.epochs}, {args.repeats} interleaved repeats")
        for name in out["ways"]:
            lo, hi = out["data_wait_share_range"][name]
            share = out["median_data_wait_share"][name]
            print(f"  {name} ({out['ways'][name] or 'no flags'}): data wait {100 * share:.0f}% "
                  f"of training ({100 * lo:.0f}-{100 * hi:.0f}%), training {out['median_train_seconds'][name]:.2f} s "
                  f"({out['train_seconds_ratio_to_first'][name]:.2f}x), forward/backward "
                  f"{out['median_forward_backward_seconds'][name]:.2f} s")
        print(f"  same losses every way: {out['same_losses']}")
    benchinfo.record("bench_data_wait", args, out, {"spec": args.spec, "device": args.device, "nproc": args.nproc})
    # on a GPU the model's scatter sums are not deterministic: equal losses are asked of CPU runs only
    return 0 if out["same_losses"] or args.device != "cpu" else 1


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
