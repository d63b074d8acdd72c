"""The main job on an embedded default: generate a graph, ingest it into 2 METIS partitions, and train
GraphSAGE on 2 local processes (RPC between them), printing per-epoch accuracy and a final summary.

Usage: ``python tools/demo.py [--out DIR] [--nodes N] [--nproc 2] [--epochs 3]``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from graphstore.cli.app import main as graphstore_cli
from training.launch import main as train_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
import toolargs  # noqa: E402  (tools/ is not a package: run as a script)

DEFAULT_SPEC = "synthetic:nodes={nodes},avg_degree=12,features=32,classes=6,seed=0"


def run(argv: list[str] | None = None) -> int:
    parser = toolargs.parser(__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / ".demo"),
                        help="working directory (default: .demo in the repo)")
    parser.add_argument("--nodes", type=toolargs.count, default=50_000)
    parser.add_argument("--nproc", type=toolargs.count, default=2, help="local training processes = partitions")
    parser.add_argument("--epochs", type=toolargs.count, default=3)
    args = parser.parse_args(argv)
    out = Path(args.out)
    dataset, metrics = out / "synthetic", out / "metrics.json"
    started = time.perf_counter()
    steps = [
        (graphstore_cli, ["ingest", DEFAULT_SPEC.format(nodes=args.nodes), str(dataset), "--parts", str(args.nproc),
                          "--method", "metis", "--overwrite", "--parents"]),
        (graphstore_cli, ["info", str(dataset)]),
        (train_cli, [str(dataset), "--nproc", str(args.nproc), "--epochs", str(args.epochs), "--fanout", "10,5",
                     "--batch-size", "512", "--lr", "0.005", "--metrics-out", str(metrics)]),
    ]
    for fn, step in steps:
        name = "graphstore" if fn is graphstore_cli else "graphstore-train"
        print(f"$ {name} {' '.join(step)}", flush=True)
        code = fn(step)
        if code:
            print(f"demo: `{name} {step[0]}` failed with exit code {code}", file=sys.stderr)
            return code
    last = json.loads(metrics.read_text())["epochs"][-1]
    print(f"demo finished in {time.perf_counter() - started:.0f} s: {args.nproc} ranks, {args.epochs} epochs, "
          f"test accuracy {last['test_acc']:.3f} (chance 0.167), last epoch {last['epoch_seconds']:.1f} s, "
          f"{int(last['remote']['requests'])} remote requests; metrics in {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(run))
