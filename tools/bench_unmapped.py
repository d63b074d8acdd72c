"""What holding a rank's resident set flat by unmapping its dataset pages would cost the sampler.

Usage::

    python tools/bench_unmapped.py [DATASET] [--every 1,8,32] [--batches 64] [--repeats 3] [--fanout 10,5]
                                   [--batch-size 1024] [--seed S] [--json]

The sampler reads its partitions' topology through memory maps, prefaulted (``sampling.graph.topology.prefault``),
so a rank's resident set (RSS) holds every page of it that it has read: page cache, shared and reclaimable,
yet counted in RSS, which therefore grows with the partition. One way to hold RSS flat is to unmap those
pages every few batches (``madvise(MADV_DONTNEED)``): the page cache keeps them, and the next read maps them
again (a minor fault, no disk read). This tool measures what that costs: the same batches sampled over
DATASET (a local path; default: a synthetic graph ingested once) with the pages kept mapped, and with them
unmapped every N batches for each N of ``--every``, and read with ``pread``, never mapped
(``Dataset.read_unmapped``, ``graphstore-train --unmapped``), passes interleaved, one thread; each batch draws the
same edges in every mode. Per mode it prints the
sampling time per batch (the unmapping included), its ratio to kept, and the most of the dataset's pages
mapped at once (summed from ``/proc/self/smaps`` through psutil, read outside the timed part).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from torch_geometric.sampler import NodeSamplerInput

import graphstore
from sampling import NeighborSampler
from sampling.graph.topology import prefault

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

SPEC = "nodes=400000,avg_degree=20,features=16,classes=8"
_MADV_DONTNEED = 4


def _maps(root: str) -> list[Any]:
    """This process's mappings of files under ``root`` (psutil: address range, resident bytes)."""
    inside = root.rstrip(os.sep) + os.sep
    return [m for m in psutil.Process().memory_maps(grouped=False) if m.path.startswith(inside)]


def mapped_ranges(root: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of files under ``root``."""
    return [tuple(int(x, 16) for x in m.addr.split("-")) for m in _maps(root)]


def resident_mb(root: str) -> float:
    """Resident pages of this process's mappings of files under ``root`` (MB)."""
    return sum(m.rss for m in _maps(root)) / 2**20


def unmap(ranges: list[tuple[int, int]]) -> None:
    """Drop these ranges' pages from this process (``madvise(MADV_DONTNEED)``; the page cache keeps them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for lo, hi in ranges:
        if libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed")


def run_mode(sampler: NeighborSampler, batches: list[torch.Tensor], root: str,
             every: int) -> tuple[float, float, float | None, int]:
    """Sample ``batches``; ``every`` > 0: unmap the dataset's pages after every that many batches (0: keep them;
    -1: ``sampler`` reads its partitions with pread, never mapped).
    Returns (seconds, most MB mapped at once, MB mapped right after the last unmapping, sampled edges)."""
    ranges = mapped_ranges(root)
    if every:  # > 0, or -1: the sampler reads with pread and maps nothing (what the other modes mapped goes first)
        unmap(ranges)
    else:  # as the sampler leaves them: what it reads, prefaulted
        for block in sampler.fast_path.blocks.blocks:
            for array in (block.indptr, block.packed if block.packed is not None else block.indices):
                prefault(array)
    seconds, most, after, edges = 0.0, resident_mb(root), None, 0
    for i, seeds in enumerate(batches):
        positions = torch.arange(i * len(seeds), (i + 1) * len(seeds))  # the batch's draws: a function of these
        start = time.perf_counter()
        edges += int(sampler.sample_from_nodes(NodeSamplerInput(positions, seeds)).row.numel())
        seconds += time.perf_counter() - start
        if every > 0 and (i + 1) % every == 0:
            most = max(most, resident_mb(root))
            start = time.perf_counter()
            unmap(ranges)
            seconds += time.perf_counter() - start
            after = resident_mb(root)
    return seconds, max(most, resident_mb(root)), after, edges


def main(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", type=toolargs.dataset,
                        help="a local dataset path (default: a synthetic graph, ingested once)")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench" / "unmapped",
                        help="where the default graph is ingested")
    parser.add_argument("--every", type=toolargs.counts, default="1,8,32",
                        help="unmap after every N batches, for each N listed")
    parser.add_argument("--batches", type=toolargs.count, default=64)
    parser.add_argument("--repeats", type=toolargs.count, default=3, help="interleaved passes over every mode")
    parser.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    parser.add_argument("--batch-size", type=toolargs.count, default=1024)
    parser.add_argument("--json", action="store_true")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args(argv)
    every = [int(n) for n in args.every.split(",")]  # positive integers: checked by the parser
    fanout = [int(k) for k in args.fanout.split(",")]
    if max(every) > args.batches:
        parser.error(f"--every {max(every)} is more than --batches {args.batches}: a pass would never unmap; "
                     f"pass --batches {max(every)} or more")
    if not sys.platform.startswith("linux"):
        parser.error("this tool reads /proc/self/smaps and madvise: Linux")
    info = benchinfo.start(args, args.json)
    torch.set_num_threads(1)
    path = args.dataset or str(benchinfo.ingested(args.data, SPEC, 1))
    if "://" in path and not path.startswith("file://"):
        parser.error(f"{path}: give a local dataset path (the tool unmaps files under it)")
    dataset = graphstore.open_dataset(path)
    root = os.path.realpath(path.removeprefix("file://"))
    sampler = NeighborSampler(dataset, fanout, seed=0)
    unmapped = graphstore.open_dataset(path)
    unmapped.read_unmapped(range(unmapped.num_parts))
    samplers = {-1: NeighborSampler(unmapped, fanout, seed=0)}
    nodes = dataset.num_nodes()
    modes = [0, *every, -1]
    totals: dict[int, list] = {m: [0.0, 0.0, None, 0] for m in modes}
    for repeat in range(args.repeats):
        rng = benchinfo.rng(args.seed, repeat)
        batches = [torch.from_numpy(rng.choice(nodes, min(args.batch_size, nodes), replace=False))
                   for _ in range(args.batches)]
        for one in (sampler, samplers[-1]):
            one.sample_from_nodes(NodeSamplerInput(None, batches[0]))  # compiled and warm before timing
        for m in modes:
            seconds, most, after, edges = run_mode(samplers.get(m, sampler), batches, root, m)
            totals[m][0] += seconds
            totals[m][1] = max(totals[m][1], most)
            totals[m][2] = after if after is None or totals[m][2] is None else max(totals[m][2], after)
            totals[m][3] += edges
    count = args.repeats * args.batches
    kept_ms = totals[0][0] / count * 1e3
    names = {0: "kept mapped", -1: "read with pread, never mapped"}
    rows = [{"mode": names.get(m, f"unmapped every {m} batches"), "every": m,
             "ms_per_batch": round(totals[m][0] / count * 1e3, 2),
             "x_kept": round(totals[m][0] / count * 1e3 / kept_ms, 2),
             "most_mapped_mb": round(totals[m][1], 1),
             "after_unmapping_mb": None if totals[m][2] is None else round(totals[m][2], 1),
             "edges_per_batch": totals[m][3] // count} for m in modes]
    result = {**info, "dataset": path, "nodes": nodes, "fanout": fanout, "batch_size": args.batch_size, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{path}: {nodes:,} nodes; fanout {fanout}, batches of {args.batch_size}, "
              f"{args.repeats} interleaved passes")
        for row in rows:
            print(f"  {row['mode']:<30} {row['ms_per_batch']:8.2f} ms/batch  {row['x_kept']:6.2f}x kept  "
                  f"at most {row['most_mapped_mb']:8.1f} MB of the dataset mapped")
    benchinfo.record("bench_unmapped", args, result, {"dataset": path, "fanout": fanout})
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
