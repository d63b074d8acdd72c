"""Sampler backends for the contract suite: in-memory Data, datasets with 1 and 3 partitions, a store pair."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import graphstore


@dataclass
class Graph:
    """A graph in the sampler's own node-ID space (input IDs for Data, global IDs for datasets)."""

    data: object  # what the sampler/loader is given
    num_nodes: int
    src: np.ndarray  # indexed by edge ID (input edge position)
    dst: np.ndarray
    node_time: np.ndarray
    edge_time: np.ndarray
    weight: np.ndarray
    x: np.ndarray  # node features by sampler ID
    to_input: np.ndarray  # sampler node ID -> input node ID


def make_graph(n: int = 400, e: int = 3000, seed: int = 0) -> tuple[Data, dict]:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    # a star: node 0 has 40 distinct in-neighbours with weights 1..4, for distribution tests
    star = np.arange(1, 41)
    src, dst = np.concatenate([src, star]), np.concatenate([dst, np.zeros(40, np.int64)])
    e = len(src)
    weight = rng.random(e).astype(np.float32) + 0.1
    weight[-40:] = np.tile(np.arange(1, 5, dtype=np.float32), 10)
    arrays = dict(x=rng.standard_normal((n, 4)).astype(np.float32), y=rng.integers(0, 3, n),
                  time=rng.integers(0, 1000, n), edge_time=rng.integers(0, 1000, e), weight=weight)
    data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), x=torch.from_numpy(arrays["x"]),
                y=torch.from_numpy(arrays["y"]), time=torch.from_numpy(arrays["time"]), num_nodes=n)
    data.edge_time = torch.from_numpy(arrays["edge_time"])
    data.weight = torch.from_numpy(weight)
    return data, dict(src=src, dst=dst, **arrays)


def _from_dataset(ds, raw: dict, data_arg) -> Graph:
    from graphstore.dataset.whole import DatasetFeatureStore

    order = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()  # global -> input
    new = np.empty_like(order)
    new[order] = np.arange(len(order))
    return Graph(data_arg, len(order), new[raw["src"]], new[raw["dst"]], raw["time"][order], raw["edge_time"],
                 raw["weight"], raw["x"][order], order)


@pytest.fixture(scope="session")
def graphs(tmp_path_factory):
    """name -> Graph for every backend; edge attrs are renamed for datasets (time, weight)."""
    data, raw = make_graph()
    out = {"data": Graph(data, 400, raw["src"], raw["dst"], raw["time"], raw["edge_time"], raw["weight"],
                         raw["x"], np.arange(400))}
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    for parts in (1, 3):
        source = GraphSource(
            {None: NodeTable(400, {k: ArrayRows(raw[k]) for k in ("x", "y", "time")})},
            {None: EdgeTable(raw["src"], raw["dst"], {"edge_time": ArrayRows(raw["edge_time"]),
                                                      "weight": ArrayRows(raw["weight"])})})
        dest = tmp_path_factory.mktemp(f"p{parts}") / "ds"
        graphstore.ingest(source, dest, num_parts=parts)
        ds = graphstore.open_dataset(dest)
        out[f"dataset{parts}"] = _from_dataset(ds, raw, ds)
        if parts == 1:
            out["pair"] = _from_dataset(ds, raw, ds.partition(0))
    return out


def serve_and_run(rank: int, world_size: int, rdzv: str, url: str, out_dir: str, body, *args) -> None:
    """One spawned rank: RPC up, its partition served, ``body(ds, transport, rank, world_size, *args)`` run
    between two barriers, RPC down; the body's result (or this rank's traceback) goes to ``out_dir/rank<r>.json``."""
    import json
    import traceback

    try:
        from sampling.distributed.server import PartitionServer
        from training.cluster.process_groups import start, stop
        from training.cluster.world import World

        transport = start(World(rank, world_size, rank, rdzv), timeout=60, use_rpc=True)
        ds = graphstore.open_dataset(url)
        PartitionServer(ds, rank).register(transport)
        torch.distributed.barrier()
        result = body(ds, transport, rank, world_size, *args)
        torch.distributed.barrier()
        stop(transport, graceful=True)
    except Exception:
        result = {"error": traceback.format_exc()}
    with open(f"{out_dir}/rank{rank}.json", "w") as fh:
        json.dump(result, fh)
