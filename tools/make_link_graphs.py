"""Write the link-prediction check graphs as npz sources: a signal-free random regular graph, Bitcoin OTC."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import toolargs  # noqa: E402  (tools/ is not a package: run as a script)


def random_regular(nodes: int, degree: int, features: int, seed: int) -> dict[str, np.ndarray]:
    """A uniformly random ``degree``-regular simple graph (both directions stored) with Gaussian features
    drawn independently of the edges: nothing in it predicts a link."""
    import networkx as nx

    graph = nx.random_regular_graph(degree, nodes, seed=seed)
    pairs = np.array(graph.edges(), dtype=np.int64).reshape(-1, 2)
    edge_index = np.concatenate([pairs.T, pairs.T[::-1]], axis=1)
    x = np.random.default_rng(seed + 1).standard_normal((nodes, features)).astype(np.float32)
    return {"edge_index": edge_index, "x": x, "num_nodes": np.array(nodes)}


def bitcoin_otc(csv: Path) -> dict[str, np.ndarray]:
    """Bitcoin OTC (``source,target,rating,time`` rows) as a directed graph with its rating times."""
    table = np.loadtxt(csv, delimiter=",", dtype=np.float64).astype(np.int64)  # unix times have fractions
    nodes, inverse = np.unique(table[:, :2], return_inverse=True)
    return {"edge_index": inverse.reshape(-1, 2).T.copy(), "edge_time": table[:, 3].copy(),
            "num_nodes": np.array(len(nodes))}


def main(argv: list[str] | None = None) -> None:
    parser = toolargs.parser(__doc__)
    parser.add_argument("kind", choices=("regular", "bitcoin"))
    parser.add_argument("out", type=Path, help="the .npz file to write")
    parser.add_argument("--nodes", type=toolargs.count, default=4000)
    parser.add_argument("--degree", type=toolargs.count, default=16)
    parser.add_argument("--features", type=toolargs.count, default=32)
    parser.add_argument("--seed", type=toolargs.integer(0), default=0)
    parser.add_argument("--csv", type=Path, default=Path("../shared/data/bitcoin_otc/soc-sign-bitcoinotc.csv"))
    args = parser.parse_args(argv)
    arrays = (random_regular(args.nodes, args.degree, args.features, args.seed) if args.kind == "regular"
              else bitcoin_otc(args.csv))
    np.savez(args.out, **arrays)
    print(f"wrote {args.out}: {arrays['num_nodes']} nodes, {arrays['edge_index'].shape[1]} directed edges")


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
