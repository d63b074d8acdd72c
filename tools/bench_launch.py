"""Benchmark how ranks start: forked from one server that imported torch and PyG once, or each a fresh interpreter.

Usage::

    python tools/bench_launch.py [--dataset DIR] [--spec SPEC] [--ranks 2,4] [--repeats 3] [--epochs 1]
                                 [--loader-workers N] [--json]

``graphstore-train --nproc N`` (as users run it) trains ``--epochs`` on ``--dataset`` (ingested from ``--spec`` on
first use, 2 partitions) with its ranks forked (the default) and with ``GRAPHSTORE_FORK_RANKS=0`` (each rank a
fresh interpreter, as before), interleaved ``--repeats`` times per rank count. With ``--loader-workers N`` each
rank also has N sampler processes: forked at its start in the first case, spawned in the second. Per job: wall seconds from start to
exit, CPU seconds of the launcher and all its processes (user + system), and the time until the first epoch's
line. Medians per case, and the forked case as a ratio to the fresh one measured in the same run.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchinfo  # noqa: E402
import toolargs  # noqa: E402

SPEC = "synthetic:nodes=20000,avg_degree=10,features=32,classes=4,seed=1,train=0.2,val=0.05"
ROOT = Path(__file__).resolve().parent.parent
MODES = {"forked": "1", "fresh": "0"}


def _job(dataset: Path, ranks: int, epochs: int, fork: str, workers: int) -> dict:
    """One ``graphstore-train`` job: wall seconds, CPU seconds of its process tree, seconds to the first epoch."""
    cmd = [sys.executable, "-m", "training.launch", str(dataset), "--nproc", str(ranks), "--epochs", str(epochs),
           "--fanout", "5,5", "--batch-size", "256", "--no-progress", *(["--loader-workers", str(workers)] * bool(workers))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=benchinfo.child_env(GRAPHSTORE_FORK_RANKS=fork), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    for line in proc.stdout:
        if first is None and line.startswith("epoch "):
            first = time.monotonic() - start
    err = proc.stderr.read()
    code = proc.wait()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        return {"failed": f"exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "first_epoch_seconds": round(first, 2)}


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "launch")
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--ranks", type=toolargs.counts, default="2,4", help="rank counts, e.g. 2,4")
    parser.add_argument("--epochs", type=toolargs.count, default=1)
    parser.add_argument("--repeats", type=toolargs.count, default=3)
    parser.add_argument("--loader-workers", type=toolargs.integer(0), default=0,
                        help="sampler processes per rank (default 0: the rank's own threads)")
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args()
    out = benchinfo.start(args, args.json)
    dataset = benchinfo.ingested(args.dataset, args.spec, 2)
    runs: dict[tuple[int, str], list[dict]] = {}
    for repeat in range(args.repeats):
        for ranks in (int(r) for r in args.ranks.split(",")):
            order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))  # ABBA: drift falls on both
            for mode in order:
                got = _job(dataset, ranks, args.epochs, MODES[mode], args.loader_workers)
                runs.setdefault((ranks, mode), []).append(got)
                if not args.json:
                    print(f"repeat {repeat + 1}, {ranks} ranks, {mode}: {got}", flush=True)
    rows = []
    for (ranks, mode), got in runs.items():
        failed = next((g["failed"] for g in got if "failed" in g), None)
        row = {"ranks": ranks, "mode": mode, "jobs": len(got)}
        if failed:
            row["failed"] = failed
        else:
            for key in ("wall_seconds", "cpu_seconds", "first_epoch_seconds"):
                row[key] = round(statistics.median(g[key] for g in got), 2)
                row[key.replace("_seconds", "_all")] = [g[key] for g in got]
        rows.append(row)
    for row in rows:
        fresh = next(r for r in rows if r["ranks"] == row["ranks"] and r["mode"] == "fresh")
        if row["mode"] == "forked" and "failed" not in row and "failed" not in fresh:
            for key in ("wall_seconds", "cpu_seconds", "first_epoch_seconds"):
                row[key.replace("_seconds", "_vs_fresh")] = round(row[key] / fresh[key], 3)
    out.update(rows=rows, dataset=str(dataset), spec=args.spec)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        cols = ["ranks", "mode", "jobs", "wall_seconds", "wall_vs_fresh", "cpu_seconds", "cpu_vs_fresh",
                "first_epoch_seconds", "first_epoch_vs_fresh"]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r.get(c, r.get("failed", "") if c == "jobs" else "")) for c in cols) + " |")
    benchinfo.record("bench_launch", args, out, {"spec": args.spec, **({"loader_workers": args.loader_workers}
                                                                        if args.loader_workers else {})})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
