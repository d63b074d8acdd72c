"""Benchmark training across hosts on the network-namespace rig: shaped links vs the same ranks on loopback.

Usage (root; iproute2 with tc)::

    python tools/bench_cluster.py [--json] [--hosts 2,4] [--rates 10gbit,1gbit,100mbit] [--spec SPEC]
                                  [--epochs 2] [--fanout 10,5] [--batch-size 256] [--data DIR]

For each host count H the graph (default: the demo graph, ``tools/demo.py``'s synthetic spec at 50,000
nodes; pass ``--spec synthetic:nodes=1000000,...`` for the 1M-node one) is ingested into H partitions
(cached under --data, one folder per spec). The same H ranks first train on loopback
(``graphstore-train --nproc H``), then on H rig hosts with every link shaped by ``tc tbf`` to each rate
(torchrun per host, as docs/training.md says). Per run, from the last epoch (the first includes numba compilation): epoch and training
seconds, bytes on the wire per host (RPC payload sent plus received, gradient all-reduce), sampling /
features / forward-backward seconds, and training speed relative to loopback.

The minimum: one epoch of the same loaders (the trainer's options) runs in this process over the
loopback transport (the same sampling and encoding code and byte counters as RPC); the bytes the sampled
batches actually needed from other partitions are the ``x`` rows of the nodes this partition could not
serve itself plus, per edge sampled on another partition, its source ID in the fewest whole bytes that
name any node of the graph (2 below 65,536 nodes, 3 below 16.7M). Not counted as needed, though a real
protocol must send them: the IDs of the requested nodes and the per-node neighbour counts. A row needed
by several batches counts once per batch (no row cache, as the trainer's default). Packed answers can
beat the per-edge term (sources within 256 IDs of each other take one byte), never the ``x`` rows.
``ratio`` is the counted RPC payload (neighbours and rows, both ways) over that minimum.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import graphstore  # noqa: E402
from tests.cluster import Cluster, rig_unavailable  # noqa: E402
from tests.training.multihost import clean_env, torchrun, wait_all  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import benchinfo  # noqa: E402  (tools/ is not a package: run as a script)
import toolargs  # noqa: E402

DEMO = "synthetic:nodes=50000,avg_degree=12,features=32,classes=6,seed=0"


def _train_args(args: argparse.Namespace, metrics: Path) -> list[str]:
    return ["--epochs", str(args.epochs), "--fanout", args.fanout, "--batch-size", str(args.batch_size),
            "--timeout", "120", "--seed", str(args.seed % 2**31), "--metrics-out", str(metrics)]


def _row(last: dict, hosts: int, link: str) -> dict:
    wire = last["wire"]
    # a host's RPC calls (requests it sent, responses it received) plus its gradient all-reduce payload
    per_host = [sum(k["sent"] + k["received"] for kinds in peers.values() for k in kinds.values()) + allreduce
                for peers, allreduce in zip(wire["per_rank"], wire["allreduce_per_rank"])]
    t = last["timing"]
    return {"hosts": hosts, "link": link, "epoch_seconds": last["epoch_seconds"], "train_seconds": last["train_seconds"],
            "mb_per_host": [round(b / 1e6, 2) for b in per_host], "bytes": wire["bytes"],
            "sampling": t.get("sampling", 0.0), "features": t.get("feature_fetch", 0.0),
            "compute": t.get("forward_backward", 0.0), "remote_wait": t.get("remote_wait", 0.0)}


def loopback(dest: Path, hosts: int, args: argparse.Namespace, work: Path) -> dict:
    metrics = work / f"loopback-{hosts}.json"
    cmd = [sys.executable, "-m", "training.launch", str(dest), "--nproc", str(hosts), "--no-progress",
           *_train_args(args, metrics)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=clean_env())
    return _row(json.loads(metrics.read_text())["epochs"][-1], hosts, "loopback")


def on_rig(dest: Path, hosts: int, rate: str, args: argparse.Namespace, work: Path) -> dict:
    metrics = work / f"rig-{hosts}-{rate}.json"
    with Cluster(hosts) as cluster:
        for host in cluster.hosts:
            cluster.shape(host, rate)
        master = cluster.hosts[0].addr
        runs = [torchrun(cluster, h, hosts, master, dest, *_train_args(args, metrics)) for h in cluster.hosts]
        outcomes = wait_all(runs, args.limit)
    failed = [(i, o.code, o.stderr[-2000:]) for i, o in enumerate(outcomes) if o.code != 0]
    if failed:
        raise RuntimeError(f"{hosts} hosts at {rate}: hosts failed: {failed}")
    return _row(json.loads(metrics.read_text())["epochs"][-1], hosts, rate)


def minimum(dest: Path, args: argparse.Namespace) -> dict:
    """One epoch of every rank's loader over the loopback transport: counted payload vs needed bytes."""
    from sampling.distributed.dist_loader import DistributedNeighborLoader
    from sampling.distributed.server import PartitionServer
    from sampling.distributed.transport import LoopbackTransport

    ds = graphstore.open_dataset(dest)
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    offsets, fanout = ds.node_offsets(), [int(k) for k in args.fanout.split(",")]
    id_bytes = max(1, -(-(ds.num_nodes() - 1).bit_length() // 8))
    needed = counted = 0
    for rank, transport in enumerate(transports):
        lo, hi = int(offsets[rank]), int(offsets[rank + 1])
        mask = ds.partition(rank)[0][None, "train_mask", None].numpy().astype(bool)
        seeds = torch.from_numpy(lo + np.flatnonzero(mask))
        loader = DistributedNeighborLoader(ds, fanout, transport, seeds, batch_size=args.batch_size, prefetch=0,
                                           seed=args.seed + rank, edge_ids=False)
        store = loader.data[0]
        info = store.local._node_info(None)
        for batch in loader:
            n_id, dst = batch.n_id.numpy(), batch.edge_index[1].numpy()
            fetched = store._servable_here(info, n_id, ["x"]) < 0  # neither owned nor a replicated halo row
            needed += int(fetched.sum()) * batch.x[0].numel() * batch.x.element_size()
            needed += int(((n_id < lo) | (n_id >= hi))[dst].sum()) * id_bytes  # edges sampled elsewhere
        snap = transport.wire.snapshot(reset=True)
        counted += sum(k["sent"] + k["received"] for kinds in snap.values() for name, k in kinds.items()
                       if name in ("neighbours", "rows"))
    return {"needed_bytes": needed, "counted_bytes": counted, "ratio": round(counted / max(needed, 1), 2)}


def main(argv: list[str] | None = None) -> int:
    p = toolargs.parser(__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--hosts", type=toolargs.counts, default="2,4")
    p.add_argument("--rates", default="10gbit,1gbit,100mbit")
    p.add_argument("--spec", default=DEMO)
    p.add_argument("--epochs", type=toolargs.count, default=2)
    p.add_argument("--fanout", type=toolargs.fanout, default="10,5")
    p.add_argument("--batch-size", type=toolargs.count, default=256)
    p.add_argument("--limit", type=toolargs.positive, default=1800,
                   help="seconds a rig run may take before it is killed")
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "graphstore-bench-cluster")
    benchinfo.add_seed_argument(p)
    benchinfo.add_record_arguments(p)
    args = p.parse_args(argv)
    info = benchinfo.start(args, args.json)
    reason = rig_unavailable()
    if reason:
        print(f"bench_cluster: {reason}", file=sys.stderr)
        return 2
    rows, minima = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        for hosts in (int(h) for h in args.hosts.split(",")):
            dest = benchinfo.ingested(args.data / hashlib.sha1(args.spec.encode()).hexdigest()[:12], args.spec, hosts)
            minima[hosts] = minimum(dest, args)
            base = loopback(dest, hosts, args, Path(tmp))
            rows.append({**base, "speed_vs_loopback": 1.0})
            for rate in args.rates.split(","):
                row = on_rig(dest, hosts, rate, args, Path(tmp))
                rows.append({**row, "speed_vs_loopback": round(base["train_seconds"] / max(row["train_seconds"], 1e-9), 2)})
    out = {**info, "spec": args.spec, "rows": rows, "minimum": minima}
    print(json.dumps(out, indent=2) if args.json else _table(out))
    benchinfo.record("bench_cluster", args, out, {"spec": args.spec, "hosts": args.hosts})
    return 0


def _table(out: dict) -> str:
    lines = ["| hosts | link | epoch s | training s | MB/host/epoch | sampling s | features s | compute s | speed vs loopback |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['hosts']} | {r['link']} | {r['epoch_seconds']:.2f} | {r['train_seconds']:.2f} | "
                     f"{max(r['mb_per_host']):.2f} | {r['sampling']:.2f} | {r['features']:.2f} | {r['compute']:.2f} | "
                     f"{r['speed_vs_loopback']:.2f} |")
    for hosts, m in out["minimum"].items():
        lines.append(f"\n{hosts} hosts: RPC payload {m['counted_bytes'] / 1e6:.2f} MB per epoch vs {m['needed_bytes'] / 1e6:.2f} "
                     f"MB needed (ratio {m['ratio']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
