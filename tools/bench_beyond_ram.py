"""Benchmark training with features larger than memory: the job in a cgroup memory limit vs the page cache.

Usage::

    python tools/bench_beyond_ram.py [--dataset DIR] [--spec SPEC] [--limit 1.5GB] [--feature-cache 256MB]
                                     [--fanout 10,5] [--batch-size 1024] [--epochs 2] [--repeats 1] [--nproc 1]
                                     [--cases page,auto,cache,unmapped,unmapped-cache,workers,workers-page,
                                     session,session-page]
                                     [--json]

``graphstore-train --nproc N`` (the launcher and its ranks, as users run it, all in one limit; ``--nproc``, 1 by
default) trains on ``--dataset`` (ingested from ``--spec`` on first use, in N partitions: 1M nodes, 1024 float32
features = 4 GB, power-law degrees, 5% train) for
``--epochs`` + 1 epochs, evaluating only after the last, and the tool stops it once ``--epochs`` epochs'
metrics are written (no evaluation is measured). Cases, interleaved ``--repeats`` times, each on the same seed (the same batches):

- ``page``: no limit, the dataset read into the page cache and locked there (``mlock``: this machine's host
  evicts pages idle for a minute, DAMON ``pageout``);
- ``auto``: the launcher and the rank in a cgroup v1 limit of ``--limit`` (it charges page cache, so rows
  really come from disk), the dataset evicted from the page cache first, the flags users give (none: the rank
  finds its features exceed its memory and reads them from disk by itself, its hottest rows in RAM in what
  the limit leaves beside its batches);
- ``cache``: the same limit and eviction, ``--feature-cache SIZE``: a RAM cache of the hottest rows too;
- ``plain``: the same limit and eviction, ``--feature-cache off``: page faults through the mapping;
- ``cold``: no limit, the dataset evicted from the page cache first: the first epoch reads its rows from disk
  through the mapping, as after the page cache turned over or on a fresh machine (``first_over_steady``);
- ``unmapped``, ``unmapped-cache``: ``auto`` and ``cache`` with ``--unmapped`` (the partition read with ``pread``,
  none of it mapped), with their rate as a ratio to the mapped case's too (``ratio_to_mapped``);
- ``workers``: ``auto`` with a sampler process beside the rank (``--loader-workers 1``): it reads x as the rank
  does, its hot rows from the rank's cache in shared memory, and the room check counts its batches;
  ``workers-page``: ``page`` with that sampler process (``workers``' ratio to the page cache is to this case
  where it ran);
- ``session``, ``session-page``: a loop of one's own instead (``tools/session_epochs.py``: ``training.Session``,
  the same model, launched by ``graphstore-run --nproc N``), as ``auto`` and as ``page`` (``--feature-cache off``);
  a session case's ``ratio_to_page_cache`` is to ``session-page``.

Per case: training seconds of the first epoch and of the steady ones after it (their mean), the first over
the steady, steps/s of the steady epochs (of the first with ``--epochs 1``), the rate as a ratio to the
page-cache case, and the first epoch's data wait, GB read from disk, the RAM cache's size (``cache_gb``, every
rank's together: the one ``--feature-cache`` gave, or the one each rank sized from what its limit leaves) and its
hits (over every rank's rows; none for ``plain``), the cgroup's peak (page cache included), the peak of what the
job's processes held themselves (``anon_peak_gb``: the cgroup's ``total_rss``, page cache aside, sampled every
0.5 s), the major page faults of a steady epoch (``major_faults``: mapped pages the limit pushed out, read again)
and OOM kills. Needs root and the cgroup v1 memory controller.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchinfo  # noqa: E402
import toolargs  # noqa: E402
import memcgroup  # noqa: E402

SPEC = "synthetic:nodes=1000000,avg_degree=10,features=1024,classes=8,seed=1,train=0.05,val=0.01"
ROOT = Path(__file__).resolve().parent.parent


def _train(dataset: Path, args: argparse.Namespace, flags: list[str], group: memcgroup.MemoryCgroup | None,
           out: Path) -> dict:
    """The records of the first ``args.epochs`` epochs of ``graphstore-train --nproc N`` (launcher and ranks in
    ``group``) with the case's ``flags`` added, or of ``tools/session_epochs.py`` under ``graphstore-run`` where
    ``flags`` start with ``session``; or ``{"failed": why}``."""
    metrics = out / "metrics.json"
    metrics.unlink(missing_ok=True)
    shape = ["--epochs", str(args.epochs + 1), "--fanout", args.fanout, "--batch-size", str(args.batch_size),
             "--seed", str(args.seed)]
    if flags[:1] == ["session"]:  # the run's own flags, then the script and its arguments
        cmd = [sys.executable, "-m", "training.run", "--nproc", str(args.nproc), "--timeout", "600", *flags[1:],
               str(ROOT / "tools" / "session_epochs.py"), str(dataset), "--out", str(metrics), *shape]
    else:
        cmd = [sys.executable, "-m", "training.launch", str(dataset), "--nproc", str(args.nproc), *shape,
               "--eval-every", str(args.epochs + 1), "--no-progress", "--metrics-out", str(metrics), "--timeout", "600",
               *flags]

    def start() -> None:  # Ctrl-C at its default (this tool may run in the background), then into the cgroup
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if group is not None:
            group.join()

    proc = subprocess.Popen(cmd, env=benchinfo.child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=start)
    epoch, deadline, anon = None, time.monotonic() + args.max_seconds, 0
    faults: dict[int, int] = {}  # epochs recorded -> the group's major faults when that many were first seen
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if group is not None:  # the job's own memory, page cache aside: sampled, so a lower bound of its peak
                anon = max(anon, group.anon_bytes())
            try:
                got = json.loads(metrics.read_text())["epochs"]
            except (OSError, ValueError, KeyError):
                continue
            if group is not None:
                faults.setdefault(len(got), group.major_faults())
            if len(got) >= args.epochs:
                epoch = got[:args.epochs]
                break
    finally:
        if proc.poll() is None:  # Ctrl-C: the launcher stops its rank; killed if it has not within 30 s
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log = proc.communicate()[0]
    if epoch is None:  # the launcher's own line names why (the ranks' lines come before it)
        lines = log.strip().splitlines() or ["(no output)"]
        why = next((line for line in reversed(lines) if line.startswith(("graphstore-train:", "graphstore-run:"))),
                   lines[-1])
        return {"failed": f"exit {proc.returncode}, no epoch recorded: {why}"}
    if group is not None:
        epoch[0]["anon_peak"] = anon
        # the steady epochs' major faults (the first epoch's, with --epochs 1), each seen within 0.5 s of its record
        first = faults.get(1, 0)
        epoch[0]["major_faults"] = (faults.get(args.epochs, first) - first) // (args.epochs - 1) \
            if args.epochs > 1 else first
    return epoch


def _row(case: str, epochs: Any, group: memcgroup.MemoryCgroup | None) -> dict:
    row: dict[str, Any] = {"case": case}
    if "failed" in epochs:
        row["failed"] = epochs["failed"]
    else:
        epoch = epochs[0]
        feats = epoch.get("features") or {}
        steady = epochs[1:] or epochs
        steady_seconds = sum(e["train_seconds"] for e in steady) / len(steady)
        row.update(train_seconds=epoch["train_seconds"], steady_seconds=round(steady_seconds, 3),
                   first_over_steady=round(epoch["train_seconds"] / steady_seconds, 3), steps=epoch["steps"],
                   steps_per_s=round(sum(e["steps"] for e in steady) / len(steady) / steady_seconds, 3),
                   data_wait=round(epoch["timing"].get("data_wait", 0.0), 1),
                   disk_gb=round(feats["disk_bytes"] / 1e9, 2) if feats else None,
                   cache_gb=round(feats.get("cache_bytes_all", feats["cache_bytes"]) / 1e9, 3) if feats else None,
                   cache_hits=round(feats["hits"] / max(feats["rows"], 1), 3) if feats.get("cache_bytes") else None,
                   loss=epoch["loss"])
    if group is not None:
        row.update(cgroup_peak_gb=round(group.peak_bytes() / 1e9, 2), oom_kills=group.oom_kills())
        if "failed" not in epochs:
            row["anon_peak_gb"] = round(epochs[0]["anon_peak"] / 1e9, 2)
            row["major_faults"] = epochs[0]["major_faults"]
    return row


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "beyond-ram")
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--limit", type=toolargs.size, default="1.5GB",
                        help="the cgroup's memory limit, page cache included")
    parser.add_argument("--feature-cache", type=toolargs.size, default="256MB")
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--epochs", type=toolargs.count, default=2,
                        help="epochs measured per run: the first, and the steady ones after it")
    parser.add_argument("--repeats", type=toolargs.count, default=1)
    parser.add_argument("--nproc", type=toolargs.count, default=1,
                        help="ranks on this host, all in the one limit; the dataset is ingested in this many "
                             "partitions")
    parser.add_argument("--cases", default="page,auto,cache",
                        help="comma-separated: page, auto, cache, plain, cold, unmapped, unmapped-cache, workers, "
                             "workers-page, session, session-page")
    parser.add_argument("--max-seconds", type=toolargs.positive, default=900,
                        help="give up on a run after this long (reported as not finishing an epoch in it)")
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args()
    why = memcgroup.available()
    if why:
        print(f"bench_beyond_ram: {why}; run it as root on Linux with cgroup v1", file=sys.stderr)
        return 2
    from graphstore.storage.cache import parse_size

    out = benchinfo.start(args, args.json)
    dataset = benchinfo.ingested(args.dataset, args.spec, args.nproc)
    limit = parse_size(args.limit, "--limit")
    cache = ["--feature-cache", args.feature_cache]
    flags = {"page": ["--feature-cache", "off"], "auto": [], "plain": ["--feature-cache", "off"], "cache": cache,
             "unmapped": ["--unmapped"], "unmapped-cache": ["--unmapped", *cache], "cold": [],
             "workers": ["--loader-workers", "1"], "workers-page": ["--loader-workers", "1", "--feature-cache", "off"],
             "session": ["session"], "session-page": ["session", "--feature-cache", "off"]}
    names = {case: "page cache" if case == "page" else "cgroup, " + (" ".join(f) or "no flag")
             for case, f in flags.items()}
    names.update({"cold": "cold page cache, no limit", "session": "session, cgroup, no flag",
                  "session-page": "session, page cache", "workers-page": "page cache, --loader-workers 1"})
    mapped_of = {names["unmapped"]: names["auto"], names["unmapped-cache"]: names["cache"]}
    pinned = ("page", "session-page", "workers-page")  # no limit, the dataset locked in the page cache
    unknown = [c for c in args.cases.split(",") if c not in names]
    if unknown:
        parser.error(f"--cases {unknown}: choose among {','.join(names)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for case in args.cases.split(","):
                if case in pinned:
                    with memcgroup.PinnedInPageCache(dataset):
                        epoch, group = _train(dataset, args, flags[case], None, Path(tmp)), None
                elif case == "cold":
                    memcgroup.drop_from_page_cache(dataset)
                    epoch, group = _train(dataset, args, flags[case], None, Path(tmp)), None
                else:
                    memcgroup.drop_from_page_cache(dataset)
                    with memcgroup.MemoryCgroup(limit) as group:
                        epoch = _train(dataset, args, flags[case], group, Path(tmp))
                        row = _row(names[case], epoch, group)
                rows.append(row if case not in (*pinned, "cold") else _row(names[case], epoch, None))
                rows[-1]["repeat"] = repeat + 1
                if not args.json:
                    print(rows[-1], flush=True)
    ran = {r["case"] for r in rows}
    for r in rows:  # a session case against the session's page-cache case, the others against graphstore-train's
        page = names["session-page"] if r["case"].startswith("session") else names["page"]
        if r["case"] == names["workers"] and names["workers-page"] in ran:  # sampler processes against theirs
            page = names["workers-page"]
        base = [b["steps_per_s"] for b in rows if b["case"] == page and "steps_per_s" in b]
        if base and "steps_per_s" in r:
            r["ratio_to_page_cache"] = round(r["steps_per_s"] / (sum(base) / len(base)), 3)
        mapped = [m["steps_per_s"] for m in rows if m["case"] == mapped_of.get(r["case"]) and "steps_per_s" in m]
        if mapped and "steps_per_s" in r:  # an unmapped case against its mapped one, averaged over repeats
            r["ratio_to_mapped"] = round(r["steps_per_s"] / (sum(mapped) / len(mapped)), 3)
    out.update(rows=rows, dataset=str(dataset), spec=args.spec)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        cols = ["case", "repeat", "train_seconds", "steady_seconds", "first_over_steady", "steps_per_s", "ratio_to_page_cache", "ratio_to_mapped",
                "data_wait", "disk_gb", "cache_gb", "cache_hits", "cgroup_peak_gb", "anon_peak_gb", "major_faults", "oom_kills"]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            cells = [str(r.get(c, "")) for c in cols]
            if "failed" in r:  # its one line where the epoch's time would be
                cells[cols.index("train_seconds")] = r["failed"].replace("|", "/")
            print("| " + " | ".join(cells) + " |")
    benchinfo.record("bench_beyond_ram", args, out, {"spec": args.spec, "limit": args.limit,
                                                     "feature_cache": args.feature_cache,
                                                     "batch_size": args.batch_size, "fanout": args.fanout,
                                                     "epochs": args.epochs, "cases": args.cases,
                                                     **({"nproc": args.nproc} if args.nproc != 1 else {})})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
