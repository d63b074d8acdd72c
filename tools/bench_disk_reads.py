"""Benchmark the disk reader's engines: how fast a batch's feature rows come off the disk at each depth.

Usage::

    python tools/bench_disk_reads.py [--dataset DIR] [--spec SPEC] [--engines threads:16,threads:32,...]
                                     [--fanout 10,5] [--batch-size 1024] [--batches 3] [--repeats 3] [--json]

The rows are the ones a training loader asks for: the node IDs of ``graphstore``'s ``NeighborLoader`` batches
(shuffled seeds of the training split, ``--fanout``, ``--batch-size``) over ``--dataset`` (by default
bench_beyond_ram's graph: 1M nodes with skewed degrees and 4 KB rows, ingested on first use). Each engine
reads them with direct I/O (``O_DIRECT``: nothing from the page cache) into a batch's rows, as
``graphstore.storage.directrows.DirectRows`` does for a rank whose features exceed its memory:

- ``threads:N``: the batch's sorted rows cut into N pieces, read by N threads at once (``pread``, rows close
  together by one call), so N reads in flight;
- ``uring:N``: one thread, an io_uring of N entries: N reads in flight, submitted and reaped by one system call
  a round (``graphstore.storage.uring``);
- ``faults``: through the mapping, as a rank whose features fit in memory gathers them (the partition's
  feature store), the dataset evicted from the page cache before the engine's turn: each missing page one
  fault, at queue depth 1, with the kernel's read-around;
- ``ahead``: the same with the store's cold-start reads (``graphstore.storage.diskrows.ColdStart``): each
  gather's pages asked for at once (``MADV_WILLNEED``) before the copy, while the gathers read from disk.

Each repeat gives every engine ``--batches`` batches of its own (the stream is dealt round-robin, so no engine
reads rows another just read: a disk or host cache would favour it), engines interleaved within a repeat.
Reports per engine the median over repeats of rows/s and MB/s read, its ratio to the first engine, and the
CPU time of the process per row (all its threads: what the reads take from a training step beside them).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchinfo  # noqa: E402
import toolargs  # noqa: E402
from bench_beyond_ram import SPEC  # noqa: E402


def _engines(raw: str) -> list[tuple[str, int]]:
    out = []
    for item in raw.split(","):
        kind, _, depth = item.partition(":")
        if kind in ("faults", "ahead") and not depth:
            out.append((kind, 0))
            continue
        if kind not in ("threads", "uring") or not depth.isdigit() or int(depth) < 1:
            raise SystemExit(f"tools/bench_disk_reads.py: error: --engines {item!r}: give threads:N or uring:N "
                             "(N >= 1), faults or ahead")
        out.append((kind, int(depth)))
    return out


def batch_ids(dataset: Path, fanout: str, batch_size: int, count: int, seed: int) -> list[np.ndarray]:
    """The local row numbers of ``x`` the first ``count`` shuffled training batches read (one partition)."""
    import torch

    import graphstore
    from sampling import NeighborLoader

    ds = graphstore.open_dataset(dataset)
    seeds = torch.from_numpy(np.flatnonzero(ds.partition(0)[0][None, "train_mask", None].numpy()))
    loader = NeighborLoader(ds, [int(k) for k in fanout.split(",")], input_nodes=seeds, batch_size=batch_size,
                            shuffle=True, seed=seed)
    out = []
    while len(out) < count:
        for batch in loader:
            out.append(batch.n_id.numpy().astype(np.int64))
            if len(out) == count:
                break
    return out


class _Mapped:
    """Rows gathered by the partition's feature store over the mapping (``ahead``: with its cold-start reads),
    the dataset opened anew for each turn (so no page of it stays mapped) and evicted from the page cache."""

    def __init__(self, dest: Path, ahead: bool) -> None:
        self.dest, self.ahead, self.store, self.rows, self.read = dest, ahead, None, 0, 0
        self.evict()

    def evict(self) -> None:
        import gc

        import torch

        import graphstore
        import memcgroup
        from graphstore.storage import diskrows

        self.store = None
        gc.collect()  # the last turn's mapping goes: its pages can be evicted
        memcgroup.drop_from_page_cache(self.dest)
        saved = diskrows.COLD_MIN_BYTES
        diskrows.COLD_MIN_BYTES = saved if self.ahead else 1 << 62  # the store decides when it opens the array
        try:
            self.store = graphstore.open_dataset(self.dest).partition(0)[0]
            self.store[None, "x", torch.zeros(1, dtype=torch.int64)]  # its reader made now
        finally:
            diskrows.COLD_MIN_BYTES = saved

    def gather(self, ids: np.ndarray) -> None:
        import torch

        from graphstore.storage.diskrows import thread_read_bytes

        before = thread_read_bytes() or 0
        self.store[None, "x", torch.from_numpy(ids)]
        self.read += (thread_read_bytes() or 0) - before
        self.rows += len(ids)

    def snapshot(self, reset: bool = False) -> dict:
        out = {"rows": self.rows, "disk_bytes": self.read}
        if reset:
            self.rows = self.read = 0
        return out


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=None,
                        help="a one-partition dataset with node features x (default: bench_beyond_ram's, ingested "
                             "on first use under --data)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/graphstore-bench/beyond-ram"))
    parser.add_argument("--spec", default=SPEC)
    parser.add_argument("--engines", default="threads:16,threads:32,threads:64,uring:16,uring:64,uring:128")
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--batches", type=toolargs.count, default=3)
    parser.add_argument("--repeats", type=toolargs.count, default=3)
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args()
    engines = _engines(args.engines)
    out = benchinfo.start(args, args.json)
    dest = args.dataset or benchinfo.ingested(args.data, args.spec, 1)

    import graphstore
    from graphstore.dataset import layout
    from graphstore.storage.directrows import direct_rows

    ds = graphstore.open_dataset(dest)
    if ds.num_parts != 1 or ds.is_hetero:
        raise SystemExit("tools/bench_disk_reads.py: error: give a homogeneous dataset of one partition")
    files = ds.chunk_files(layout.node_array(0, ds.manifest.node_types[0].key, "x"))
    readers = []
    for kind, depth in engines:
        if kind in ("faults", "ahead"):
            readers.append(_Mapped(dest, kind == "ahead"))
            continue
        reader = direct_rows(files, threads=depth, ring=depth if kind == "uring" else 0)
        if reader is None:
            raise SystemExit(f"tools/bench_disk_reads.py: error: the file system of {dest} refuses O_DIRECT; "
                             "put the dataset on a local disk")
        if kind == "uring" and not reader.ring:
            raise SystemExit("tools/bench_disk_reads.py: error: this kernel offers no io_uring; drop the uring "
                             "engines")
        readers.append(reader)
    stream = iter(batch_ids(dest, args.fanout, args.batch_size, args.batches * len(engines) * (args.repeats + 1),
                            args.seed))
    for reader in readers:  # a first batch each, not measured: threads started, buffers made
        reader.gather(next(stream))
    runs: list[list[dict]] = [[] for _ in engines]
    for _ in range(args.repeats):
        for e, reader in enumerate(readers):
            mine = [next(stream) for _ in range(args.batches)]
            reader.snapshot(reset=True)
            if isinstance(reader, _Mapped):
                reader.evict()
            started, cpu = time.perf_counter(), time.process_time()
            for ids in mine:
                reader.gather(ids)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            snap = reader.snapshot(reset=True)
            runs[e].append({"rows_per_s": snap["rows"] / seconds, "mb_per_s": snap["disk_bytes"] / 1e6 / seconds,
                            "rows": snap["rows"], "cpu_us_per_row": 1e6 * cpu / max(snap["rows"], 1)})
    rows = []
    for (kind, depth), got in zip(engines, runs):
        rows.append({"engine": f"{kind}:{depth}" if depth else kind, "in_flight": depth or None,
                     "rows_per_s": round(statistics.median(r["rows_per_s"] for r in got)),
                     "mb_per_s": round(statistics.median(r["mb_per_s"] for r in got), 1),
                     "cpu_us_per_row": round(statistics.median(r["cpu_us_per_row"] for r in got), 2),
                     "rows_per_batch": round(statistics.mean(r["rows"] for r in got) / args.batches)})
    for r in rows:
        r["ratio_to_first"] = round(r["rows_per_s"] / rows[0]["rows_per_s"], 3)
    out.update(rows=rows, dataset=str(dest), row_bytes=files.row_bytes)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        cols = ["engine", "rows_per_s", "mb_per_s", "ratio_to_first", "cpu_us_per_row", "rows_per_batch"]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    benchinfo.record("bench_disk_reads", args, out, {"engines": args.engines, "fanout": args.fanout,
                                                     "batch_size": args.batch_size, "batches": args.batches,
                                                     "repeats": args.repeats})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
