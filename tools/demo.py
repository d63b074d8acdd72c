"""The main job on an embedded default: generate a graph, ingest it into 2 METIS partitions, describe it.

Usage: ``python tools/demo.py [--out DIR] [--nodes N]``. Training joins this demo with the training
package (issue: distributed training end to end).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphstore.cli import main as graphstore_cli

DEFAULT_SPEC = "synthetic:nodes={nodes},avg_degree=12,features=32,classes=6,seed=0"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / ".demo" / "synthetic"),
                        help="dataset directory (default: .demo/synthetic in the repo)")
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--parts", type=int, default=2)
    args = parser.parse_args(argv)
    spec = DEFAULT_SPEC.format(nodes=args.nodes)
    steps = [
        ["ingest", spec, args.out, "--parts", str(args.parts), "--method", "metis", "--overwrite"],
        ["info", args.out],
        ["verify", args.out],
    ]
    for step in steps:
        print(f"$ graphstore {' '.join(step)}", flush=True)
        code = graphstore_cli(step)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run())
