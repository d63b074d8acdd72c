"""Which feature rows a RAM cache should hold: cache policies' hits on the rows a training loader reads.

Usage::

    python tools/bench_cache_policy.py [--dataset DIR | --spec SPEC] [--fanout 10,5] [--batch-size 1024]
                                       [--epochs 3] [--capacities 32768,131072] [--json]

The loader is graphstore-train's own (``sampling.NeighborLoader`` over partition 0's training nodes,
shuffled): every batch's ``n_id`` (the rows its features are gathered for) is recorded for ``--epochs``
passes. Each policy then replays the same trace at each capacity (rows held), and the hit share of the last
pass is reported (the caches that learn have warmed over the passes before):

- ``static``: the rows most often the source of an edge into the partition, fixed before training (what
  ``--feature-cache`` holds today, :func:`training.loop.featurecache.hottest`);
- ``sieve``: SIEVE (a FIFO queue whose hand skips and clears rows hit since it last passed; a miss evicts the
  first unmarked row), admitting every row missed;
- ``static+sieve``: half the capacity static, half SIEVE;
- ``s3fifo``: S3-FIFO (a small FIFO of a tenth of the capacity that every missed row enters, a main FIFO for
  the rest, a ghost queue of the keys the small one dropped; a row hit at least ``--s3fifo-promote`` times in
  the small queue, or missed again while its key is a ghost, enters the main one, whose rows hit since they
  last passed its tail go round again, up to 3 times);
- ``static+s3fifo``: half the capacity static, half S3-FIFO;
- ``first_pass``: the rows read most often in the first pass, fixed after it (pre-sampling).

No time is measured: a hit is a row not read from disk, whatever the disk.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# bench_beyond_ram's graph (skewed degrees), with 4 features: the rows read do not depend on their width
SPEC = "synthetic:nodes=1000000,avg_degree=10,features=4,classes=8,seed=1,train=0.05,val=0.01"


@njit(cache=True)
def replay(trace: np.ndarray, fixed: np.ndarray, capacity: int, count_from: int) -> int:  # pragma: no cover
    """Hits from position ``count_from`` on of ``trace`` (row numbers; the reads before it warm the cache) on
    ``fixed`` rows (a bool per row) plus a SIEVE cache of ``capacity``."""
    n = len(fixed)
    slot = np.full(n, -1, np.int64)
    key = np.full(max(capacity, 1), -1, np.int64)
    marked = np.zeros(max(capacity, 1), np.uint8)
    newer = np.full(max(capacity, 1), -1, np.int64)  # towards the head (newest)
    older = np.full(max(capacity, 1), -1, np.int64)  # towards the tail (oldest)
    head, tail, hand, used, hits = -1, -1, -1, 0, 0
    for i in range(len(trace)):
        row = trace[i]
        counted = i >= count_from
        if fixed[row]:
            hits += counted
            continue
        if capacity == 0:
            continue
        s = slot[row]
        if s >= 0:
            hits += counted
            marked[s] = 1
            continue
        if used < capacity:
            s = used
            used += 1
        else:
            s = hand if hand >= 0 else tail
            while marked[s]:
                marked[s] = 0
                s = newer[s] if newer[s] >= 0 else tail
            hand = newer[s]
            if older[s] >= 0:
                newer[older[s]] = newer[s]
            else:
                tail = newer[s]
            if newer[s] >= 0:
                older[newer[s]] = older[s]
            else:
                head = older[s]
            slot[key[s]] = -1
        key[s], marked[s], slot[row] = row, 0, s
        older[s], newer[s] = head, -1
        if head >= 0:
            newer[head] = s
        head = s
        if tail < 0:
            tail = s
    return hits


@njit(cache=True)
def replay_s3fifo(trace: np.ndarray, fixed: np.ndarray, capacity: int, count_from: int,
                  promote: int) -> int:  # pragma: no cover
    """As :func:`replay`, with an S3-FIFO cache of ``capacity`` rows (a tenth of them the small queue)."""
    n = len(fixed)
    small_cap = max(capacity // 10, 1)
    main_cap = max(capacity - small_cap, 1)
    where = np.zeros(n, np.uint8)  # 0: not cached, 1: small queue, 2: main queue
    freq = np.zeros(n, np.uint8)
    small = np.empty(small_cap, np.int64)
    main = np.empty(main_cap, np.int64)
    ghost = np.empty(main_cap, np.int64)
    ghost_seq = np.full(n, -1, np.int64)
    s_tail = s_len = m_tail = m_len = pushed = hits = 0
    for i in range(len(trace)):
        row = trace[i]
        counted = i >= count_from
        if fixed[row] or where[row]:
            hits += counted
            if where[row]:
                freq[row] = min(freq[row] + 1, 3)
            continue
        if capacity < 2:
            continue
        into_main = ghost_seq[row] >= 0 and pushed - ghost_seq[row] <= main_cap
        ghost_seq[row] = -1
        while not into_main and s_len == small_cap:  # make room in the small queue
            old = small[s_tail]
            s_tail = (s_tail + 1) % small_cap
            s_len -= 1
            if freq[old] >= promote:  # hit often enough while small: to the main queue
                while m_len == main_cap:
                    m_tail, m_len = _main_evict(main, m_tail, m_len, where, freq)
                main[(m_tail + m_len) % main_cap] = old
                m_len += 1
                where[old], freq[old] = 2, 0
            else:  # dropped, its key remembered
                where[old] = 0
                ghost[pushed % main_cap] = old
                ghost_seq[old] = pushed
                pushed += 1
        if into_main:
            while m_len == main_cap:
                m_tail, m_len = _main_evict(main, m_tail, m_len, where, freq)
            main[(m_tail + m_len) % main_cap] = row
            m_len += 1
            where[row], freq[row] = 2, 0
        else:
            small[(s_tail + s_len) % small_cap] = row
            s_len += 1
            where[row], freq[row] = 1, 0
    return hits


@njit(cache=True)
def _main_evict(main, m_tail, m_len, where, freq):  # pragma: no cover
    """One step of the main queue's eviction: its oldest row goes round again (one hit fewer) or leaves."""
    cap = len(main)
    old = main[m_tail]
    m_tail = (m_tail + 1) % cap
    if freq[old] > 0:
        freq[old] -= 1
        main[(m_tail + m_len - 1) % cap] = old
        return m_tail, m_len
    where[old] = 0
    return m_tail, m_len - 1


def trace_of(dest: Path, fanout: list[int], batch_size: int, epochs: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """The rows every batch of ``epochs`` passes reads (concatenated) and where each pass starts."""
    import torch

    import graphstore
    from sampling import NeighborLoader

    ds = graphstore.open_dataset(dest)
    store = ds.partition(0)[0]
    seeds = torch.from_numpy(np.flatnonzero(store[None, "train_mask", None].numpy()))
    loader = NeighborLoader(ds, fanout, input_nodes=seeds, batch_size=batch_size, shuffle=True, seed=seed)
    rows, starts = [], [0]
    for _ in range(epochs):
        for batch in loader:
            rows.append(batch.n_id.numpy().astype(np.int64))
        starts.append(sum(len(r) for r in rows))
    return np.concatenate(rows), starts


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.loop.featurecache import hottest

    dest = Path(args.dataset) if args.dataset else benchinfo.ingested(args.data, args.spec, 1)
    import graphstore

    ds = graphstore.open_dataset(dest)
    if ds.is_hetero or ds.num_parts != 1:
        raise SystemExit("tools/bench_cache_policy.py: error: give a homogeneous dataset of one partition")
    fanout = [int(h) for h in args.fanout.split(",")]
    trace, starts = trace_of(dest, fanout, args.batch_size, args.epochs, args.seed)
    n = ds.num_nodes()
    last = slice(starts[-2], starts[-1])
    rows = []
    for capacity in (int(c) for c in args.capacities.split(",")):
        capacity = min(capacity, n)
        fixed = {}
        for name, size in (("static", capacity), ("static+sieve", capacity // 2), ("static+s3fifo", capacity // 2)):
            mask = np.zeros(n, np.bool_)
            mask[hottest(ds, 0, None, size)] = True
            fixed[name] = mask
        counts = np.bincount(trace[:starts[1]], minlength=n)
        fixed["first_pass"] = np.zeros(n, np.bool_)
        fixed["first_pass"][np.argsort(-counts, kind="stable")[:capacity]] = True
        none = np.zeros(n, np.bool_)
        policies = {"static": (fixed["static"], 0), "sieve": (none, capacity),
                    "static+sieve": (fixed["static+sieve"], capacity - capacity // 2),
                    "s3fifo": (none, capacity), "static+s3fifo": (fixed["static+s3fifo"], capacity - capacity // 2),
                    "first_pass": (fixed["first_pass"], 0)}
        hits = {}
        for name, (mask, dynamic) in policies.items():  # hits of the last pass, warmed by the passes before
            hit = (replay_s3fifo(trace, mask, dynamic, last.start, args.s3fifo_promote) if "s3fifo" in name
                   else replay(trace, mask, dynamic, last.start))
            hits[name] = round(hit / max(last.stop - last.start, 1), 4)
        rows.append({"capacity_rows": capacity, "capacity_share": round(capacity / n, 4), "hit_share": hits,
                     "best": max(hits, key=hits.get)})
    return {"dataset": str(dest), "spec": None if args.dataset else args.spec, "fanout": fanout,
            "batch_size": args.batch_size, "epochs": args.epochs, "rows_read_per_pass": int(last.stop - last.start),
            "distinct_rows_per_pass": int(len(np.unique(trace[last]))), "num_rows": int(n), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dataset", type=toolargs.dataset, help="a dataset of one partition (default: --spec)")
    parser.add_argument("--spec", default=SPEC, help="the graph to ingest when no --dataset is given")
    parser.add_argument("--data", type=Path, default=ROOT / "bench-out" / "cache_policy",
                        help="where --spec is ingested")
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--epochs", type=toolargs.integer(2), default=3, help="passes recorded (at least 2)")
    parser.add_argument("--capacities", type=toolargs.counts, default="32768,65536,131072,262144",
                        help="cache sizes to replay, in rows")
    parser.add_argument("--s3fifo-promote", type=toolargs.integer(1), default=1,
                        help="hits a row needs in S3-FIFO's small queue to enter the main one (the paper: 1 or 2)")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    info = benchinfo.start(args, args.json)
    out = {**info, **run(args)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['dataset']}: fanout {out['fanout']}, batch {out['batch_size']}, the last of {out['epochs']} "
              f"passes: {out['rows_read_per_pass']:,} rows read, {out['distinct_rows_per_pass']:,} distinct of "
              f"{out['num_rows']:,}")
        for row in out["rows"]:
            shares = "  ".join(f"{k} {v:.3f}" for k, v in row["hit_share"].items())
            print(f"  {row['capacity_rows']:>9,} rows ({row['capacity_share']:.1%}): hits {shares}  "
                  f"(best: {row['best']})")
    benchinfo.record("bench_cache_policy", args, out, {"dataset": out["spec"] or out["dataset"],
                                                       "fanout": args.fanout, "batch_size": args.batch_size})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
