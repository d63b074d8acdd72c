"""What checking costs: the topology check at first use, and ``verify_reads`` on a partition's arrays.

Usage: ``.venv/bin/python tools/bench_verify.py [--data DIR] [--nodes N]`` (without ``--data`` a synthetic
graph is ingested into a temporary directory). Prints, for partition 0 with the page cache warm, the time of
each check (topology checksums and CSC invariants, done at first use; node-array checksums, done
with ``verify_reads``) next to a plain read of the same bytes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(path: str, repeats: int) -> list[tuple[str, float, int]]:
    """(what, best seconds, bytes) of each check over partition 0, against a plain read of the same bytes."""
    import numpy as np

    import graphstore
    from graphstore.storage import integrity
    from graphstore.dataset import layout

    ds = graphstore.open_dataset(path)
    m = ds.manifest
    tiny = np.array([0, 1], np.int64)
    integrity.check_csc("warm-up", tiny, tiny[:1], tiny[:1], None, 2, 2, {})  # numba: load the compiled kernels
    topo = [p for p in m.arrays if p.startswith("part_00000/edges/") and p.rsplit("/", 1)[1] in layout.TOPOLOGY]
    nodes = [p for p in m.arrays if p.startswith("part_00000/nodes/")]
    size = {p: int(np.dtype(m.arrays[p].dtype).itemsize * np.prod(m.arrays[p].shape)) for p in m.arrays}
    arrays = {et: ds.topology(0, et) for et in ds.edge_types}
    src = {et: next(t for t in m.node_types if t.key == m.edge_type(et).src).num_nodes for et in ds.edge_types}

    def invariants() -> None:
        for et, (ptr, idx, eid, packed) in arrays.items():
            integrity.check_csc("bench", ptr, idx, eid, packed, src[et], m.edge_type(et).num_edges, {})

    def read(paths: list[str]) -> None:
        for p in paths:
            np.asarray(ds.array(p)).view(np.uint8).sum(dtype=np.uint64)  # touch every byte

    def crc(paths: list[str]) -> None:
        for p in paths:
            integrity.verify_chunks(ds.location, p, m.arrays[p])

    read(topo + nodes)  # page cache warm
    return [("topology: plain read (sum of bytes)", _best(lambda: read(topo), repeats), sum(size[p] for p in topo)),
            ("topology: checksums", _best(lambda: crc(topo), repeats), sum(size[p] for p in topo)),
            ("topology: CSC invariants", _best(invariants, repeats), sum(size[p] for p in topo)),
            ("node arrays: plain read (sum of bytes)", _best(lambda: read(nodes), repeats),
             sum(size[p] for p in nodes)),
            ("node arrays: verify_reads checksums", _best(lambda: crc(nodes), repeats), sum(size[p] for p in nodes))]


def main() -> None:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--data", type=toolargs.dataset, help="an existing dataset (default: ingest a synthetic one)")
    parser.add_argument("--nodes", type=toolargs.count, default=400_000)
    parser.add_argument("--repeats", type=toolargs.count, default=3)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    benchinfo.add_seed_argument(parser)
    benchinfo.add_record_arguments(parser)
    args = parser.parse_args()
    result = benchinfo.start(args, args.json)  # the checks read every byte: no random draws (seed: the graph's)
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        path = args.data
        if path is None:
            import graphstore

            path = os.path.join(tmp, "ds")
            spec = f"synthetic:nodes={args.nodes},avg_degree=20,features=64,classes=8,seed={args.seed}"
            graphstore.ingest(spec, path, num_parts=2)
            if not args.json:
                print(f"dataset: {spec}, 2 partitions")
        rows = measure(path, args.repeats)
    out = {**result, "rows": [{"check": what, "seconds": seconds, "bytes": nbytes} for what, seconds, nbytes in rows]}
    if args.json:
        print(json.dumps(out))
    else:
        for what, seconds, nbytes in rows:
            print(f"{what:40s} {seconds * 1e3:8.1f} ms  {nbytes / 1e6:7.1f} MB  {nbytes / seconds / 1e9:5.2f} GB/s "
                  f"(best of {args.repeats}, partition 0)")
    benchinfo.record("bench_verify", args, out, {"data": args.data} if args.data else {"nodes": args.nodes})


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
