"""The warm-up groups of ``graphstore`` and ``sampling``: ingest, and every sampler driver and variant, on tiny graphs.

Each case runs a public entry point (``graphstore.ingest``, the loaders, the distributed loaders over a
loopback transport) for one batch, so numba compiles exactly the specialisations those paths call: the
one-call fast path (in-memory graphs and whole datasets), the per-hop driver (heterogeneous graphs, a
partition's store, the distributed sampler and its partition servers), with each variant that changes
the kernels' argument types (weights, node and edge times, edge masks, a link batch's exclusion), over
one partition a rank and two (the kernels' per-block tuples are padded to four entries, so both, and
three or four, run the same specialisations: :func:`sampling.graph.kernel_args.arity`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sampling.warmup.runner import Group, Workspace

FANOUT = [3, 2]
_N, _E = 60, 360  # nodes and edges of the tiny graphs: enough for every partition to own some of each
WIDE = 2**40  # node/edge times spanning more than 2**31 (e.g. milliseconds): 64-bit time-sorted keys


def groups() -> list[Group]:
    """The ``sampling`` entry of ``graphstore.warmup``: its groups, in the order they run."""
    return [  # graphstore-train's paths first: an interrupted warm-up has done those
        Group("ingest", "graphstore ingest (metis, random, range) and opening a dataset", _ingest, 10, 5),
        Group("distributed", "the distributed loaders and partition servers (loopback), 1 and 2 partitions a rank",
              _distributed, 20, 133),
        Group("memory", "loaders over in-memory PyG graphs (Data): every variant", _memory, 40, 103),
        Group("hetero", "loaders over in-memory HeteroData: the per-hop driver's variants", _hetero, 50, 23),
        Group("dataset", "loaders over a whole dataset and over one partition's stores", _dataset, 60, 68),
        Group("layouts", "loaders over unmapped partitions, int64 IDs, a heterogeneous dataset, the disk reader",
              _layouts, 70, 63),
    ]  # costs: `graphstore warmup --jobs 1 --json` on a cold cache (2026-11-30, 2-core Xeon), each group's seconds


# -- tiny graphs ----------------------------------------------------------------------------------------------


def arrays(seed: int = 0, wide: bool = False) -> dict[str, np.ndarray]:
    """A small random graph's columns: endpoints, node features/labels/masks/times, edge times/weights/splits."""
    rng = np.random.default_rng(seed)
    scale = WIDE if wide else 1000
    masks = rng.integers(0, 3, _N)
    return dict(src=rng.integers(0, _N, _E), dst=rng.integers(0, _N, _E),
                x=rng.standard_normal((_N, 4)).astype(np.float32), y=rng.integers(0, 3, _N),
                x3=rng.standard_normal((_N, 3)).astype(np.float32),  # rows of 12 bytes: gathered in 4-byte words
                train_mask=masks == 0, val_mask=masks == 1, test_mask=masks == 2,
                time=rng.integers(0, scale, _N), etime=rng.integers(0, scale, _E),
                weight=rng.random(_E).astype(np.float32) + 0.1, link_split=rng.integers(0, 3, _E).astype(np.int8))


def pyg_data(seed: int = 0, wide: bool = False) -> Any:
    from torch_geometric.data import Data

    a = arrays(seed, wide)
    data = Data(edge_index=torch.from_numpy(np.stack([a["src"], a["dst"]])), num_nodes=_N)
    for name in ("x", "y", "time", "train_mask"):
        data[name] = torch.from_numpy(a[name])
    for name in ("etime", "weight", "link_split"):
        data[name] = torch.from_numpy(a[name])
    return data


def pyg_hetero(seed: int = 0) -> Any:
    """paper (features, labels, times) and author (nothing); writes, its reverse and cites (edge times)."""
    from torch_geometric.data import HeteroData

    a, b = arrays(seed), arrays(seed + 1)
    data = HeteroData()
    data["paper"].x, data["paper"].y = torch.from_numpy(a["x"]), torch.from_numpy(a["y"])
    data["paper"].time, data["paper"].train_mask = torch.from_numpy(a["time"]), torch.from_numpy(a["train_mask"])
    data["author"].num_nodes = _N
    for etype, cols in ((("author", "writes", "paper"), b), (("paper", "cites", "paper"), a)):
        data[etype].edge_index = torch.from_numpy(np.stack([cols["src"], cols["dst"]]))
        data[etype].time = torch.from_numpy(cols["etime"])
        data[etype].weight = torch.from_numpy(cols["weight"])
        data[etype].link_split = torch.from_numpy(cols["link_split"])
    rev, writes = data["paper", "rev_writes", "author"], data["author", "writes", "paper"]
    rev.edge_index, rev.weight = writes.edge_index.flip(0), writes.weight  # every type weighted: see sampling.graph.kernel_args
    return data


def write_homogeneous(dest: Path, *, parts: int = 2, wide: bool = False, link_split: bool = True) -> None:
    """Ingest a tiny homogeneous graph: node x/y/masks/time, edge etime/weight; a stored link split."""
    import graphstore
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    a = arrays(0, wide)
    nodes = NodeTable(_N, {k: ArrayRows(a[k]) for k in ("x", "x3", "y", "train_mask", "val_mask", "test_mask",
                                                          "time")})
    edges = EdgeTable(a["src"], a["dst"], {k: ArrayRows(a[k]) for k in ("etime", "weight")})
    graphstore.ingest(GraphSource({None: nodes}, {None: edges}, name="warmup"), str(dest), num_parts=parts,
                      link_split="0.8,0.1,0.1" if link_split else None)


def write_int64_ids(dest: Path) -> None:
    """The tiny homogeneous graph as ingest writes a graph whose node IDs or edge count pass 2**31: without
    the packed int32 (source, edge ID) pairs, so the samplers read the int64 ``indices``/``eid``."""
    from unittest import mock

    from graphstore.ingest import edge_stage

    with mock.patch.object(edge_stage, "_INT32_MAX", -1):  # what a graph past 2**31 gets, on 60 nodes
        write_homogeneous(dest, parts=1, link_split=False)


def write_mag(dest: Path) -> None:
    """The heterogeneous synthetic graph graphstore-train users start from (paper times), 2 partitions."""
    import graphstore

    graphstore.ingest("synthetic-mag:papers=300,features=4,classes=3,seed=1", str(dest), num_parts=2)


def homogeneous(ws: Workspace) -> Any:
    return ws.dataset("homogeneous", write_homogeneous)


def mag(ws: Workspace) -> Any:
    return ws.dataset("mag", write_mag)


def first(loader: Iterable) -> None:
    """Draw one batch (every kernel of the path runs), then let the loader go."""
    it = iter(loader)
    next(it)
    close = getattr(it, "close", None)
    if close:
        close()


# -- groups ---------------------------------------------------------------------------------------------------


def _ingest(ws: Workspace) -> None:
    import graphstore

    for method in ("metis", "random", "range"):
        dest = ws.path / f"ingest-{method}"
        graphstore.ingest("synthetic:nodes=300,avg_degree=4,features=4,classes=3,seed=1", str(dest), num_parts=2,
                          method=method)
        ds = graphstore.open_dataset(str(dest))
        for part in range(ds.num_parts):
            ds.partition(part)[0][None, "x", None]  # rows through the gather kernel
            ds.topology(part, None)  # the topology checks
    homogeneous(ws)
    mag(ws)


_NODE_OPTIONS: list[dict[str, Any]] = [
    {}, {"replace": True}, {"disjoint": True}, {"weight_attr": "weight"},
    {"time_attr": "time"}, {"time_attr": "time", "temporal_strategy": "last"}, {"time_attr": "etime"},
    {"time_attr": "etime", "weight_attr": "weight"}, {"subgraph_type": "bidirectional"}, {"subgraph_type": "induced"},
]


def _link_cases(data: Any, etype: Any = None) -> list[dict[str, Any]]:
    """Link loader options: negatives of both kinds, the leak-free masks and exclusion, in time or not."""
    from sampling.graph.edgemask import MessageEdges

    store = data[etype] if etype else data
    label = (etype, store.edge_index[:, :24]) if etype else store.edge_index[:, :24]
    times = (store.time if etype else store.etime)[:24]
    binary, triplet = dict(mode="binary", amount=1), dict(mode="triplet", amount=2)
    leak_free = dict(message_edges=MessageEdges(etype, (0,)), exclude_seed_edges=True)
    timed = [{"edge_label_time": times, "time_attr": name} for name in (("time",) if etype else ("etime", "time"))]
    cases = [{"neg_sampling": binary}, {"neg_sampling": triplet}, {"neg_sampling": binary, **leak_free},
             {"neg_sampling": triplet, **leak_free}, *({"neg_sampling": binary, **leak_free, **t} for t in timed)]
    return [{"edge_label_index": label, **case} for case in cases]


def _loaders(data: Any, node_options: list[dict[str, Any]], input_nodes: Any, link_etype: Any = None) -> None:
    from sampling import LinkNeighborLoader, NeighborLoader

    for options in node_options:
        first(NeighborLoader(data, FANOUT, input_nodes=input_nodes, batch_size=8, **_seed_times(options)))
    for options in _link_cases(data, link_etype):
        first(LinkNeighborLoader(data, FANOUT, batch_size=8, **options))


def _seed_times(options: dict[str, Any], seeds: int = _N) -> dict[str, Any]:
    """``options``, with a time per seed node when the time is an edge time (nodes have none)."""
    return {**options, "input_time": torch.full((seeds,), WIDE)} if options.get("time_attr") == "etime" else options


def _masked() -> dict[str, Any]:
    """A node loader whose messages pass over training links only (link-prediction inference): edge masks
    without a link batch's exclusion."""
    from sampling.graph.edgemask import MessageEdges

    return {"message_edges": MessageEdges(None, (0,))}


def _memory(ws: Workspace) -> None:
    _loaders(pyg_data(), [*_NODE_OPTIONS, _masked()], None)
    first_time = [o for o in _NODE_OPTIONS if "time_attr" in o]
    _loaders(pyg_data(wide=True), first_time, None)  # 64-bit time-sorted keys


def _hetero(ws: Workspace) -> None:
    options = [{}, {"replace": True}, {"disjoint": True}, {"weight_attr": "weight"}, {"time_attr": "time"},
               {"time_attr": "time", "temporal_strategy": "last"}, {"subgraph_type": "bidirectional"},
               {"subgraph_type": "induced"}]  # "time": paper nodes' and every edge type's times
    _loaders(pyg_hetero(), options, ("paper", None), ("author", "writes", "paper"))


def _dataset(ws: Workspace) -> None:
    from sampling import NeighborLoader

    for ds in (homogeneous(ws), ws.dataset("wide", lambda d: write_homogeneous(d, wide=True))):
        for options in _NODE_OPTIONS:
            first(NeighborLoader(ds, FANOUT, batch_size=8, **_seed_times(options)))
            _one_partition(ds, options)


def _layouts(ws: Workspace) -> None:
    from sampling import NeighborLoader

    for options in ({}, {"replace": True}, {"disjoint": True}):  # partitions read with pread (--unmapped)
        first(NeighborLoader(_unmapped(ws), FANOUT, batch_size=8, **options))
    first(NeighborLoader(homogeneous(ws), FANOUT, batch_size=8, **_masked()))
    wide_ids = ws.dataset("int64-ids", write_int64_ids)  # no packed pairs: the int64 arrays, with each variant
    for options in ({}, {"time_attr": "etime"}, {"time_attr": "etime", "weight_attr": "weight"}):
        first(NeighborLoader(wide_ids, FANOUT, batch_size=8, **_seed_times(options)))
    ds = mag(ws)
    first(NeighborLoader(ds, FANOUT, input_nodes=("paper", None), batch_size=8))
    first(NeighborLoader(ds, FANOUT, input_nodes=("paper", None), batch_size=8, time_attr="time"))
    _disk_reader(homogeneous(ws))


def _disk_reader(ds: Any) -> None:
    """The reader of features larger than memory (``--feature-cache``), with an io_uring and with threads, and
    its RAM cache of hot rows (through the page cache where the scratch folder refuses direct I/O); and the
    pages a large mapped array's gathers ask for ahead while the page cache is cold."""
    import mmap

    from graphstore.dataset import layout
    from graphstore.storage.diskrows import will_need
    from graphstore.storage.directrows import direct_rows

    path = layout.node_array(0, ds.manifest.node_types[0].key, "x")
    for ring in (8, 0):
        files = ds.chunk_files(path)
        reader = (direct_rows(files, None, np.array([0, 1]), threads=2, ring=ring)
                  or direct_rows(files, None, np.array([0, 1]), threads=2, ring=ring, direct=False))
        reader.gather(np.array([1, 5, 0, 3], np.int64))
    pages = np.frombuffer(mmap.mmap(-1, mmap.PAGESIZE), np.uint8)  # a mapped array's cold-start reads
    will_need(pages.ctypes.data, np.zeros(1, np.int64), np.zeros(1, np.int64), mmap.PAGESIZE)


def _unmapped(ws: Workspace) -> Any:
    """The homogeneous dataset opened anew, every partition read with pread, never mapped."""
    import graphstore

    ds = graphstore.open_dataset(str(homogeneous(ws).url))
    ds.read_unmapped(range(ds.num_parts))
    return ds


def _one_partition(ds: Any, options: dict[str, Any]) -> None:
    """One hop over partition 0's store pair (a loader would want rows of nodes other partitions own)."""
    from torch_geometric.sampler import NodeSamplerInput

    from sampling import NeighborSampler

    if options.get("subgraph_type") == "induced" or options.get("time_attr") == "time":
        return  # node times of a partition's store: its own nodes' only (an IndexError for the others)
    options = _seed_times(options, 4)
    seed_time = options.pop("input_time", None)
    sampler = NeighborSampler(ds.partition(0), FANOUT[:1], **options)
    sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(4), seed_time))


def _distributed(ws: Workspace) -> None:
    from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
    from sampling.graph.edgemask import MessageEdges

    ds = homogeneous(ws)
    for world in (2, 1):  # a partition per rank (and remote ones), both partitions in one rank
        for options in ({}, {"weight_attr": "weight"}, {"time_attr": "time"}, {"disjoint": True},
                        {"subgraph_type": "bidirectional"}):
            with ranks(ds, world) as (transport, layout):
                first(DistributedNeighborLoader(ds, FANOUT, transport, "train_mask", layout=layout, batch_size=8,
                                                prefetch=0, **options))
        for options in ({}, {"disjoint": True}):  # --unmapped
            with ranks(_unmapped(ws), world) as (transport, layout):
                first(DistributedNeighborLoader(_unmapped(ws), FANOUT, transport, "train_mask", layout=layout,
                                                batch_size=8, prefetch=0, **options))
        leak_free = dict(message_edges=MessageEdges(None, (0,)), exclude_seed_edges=True)
        for options in ({}, leak_free, {**leak_free, "time_attr": "etime"}):
            with ranks(ds, world) as (transport, layout):
                first(DistributedLinkNeighborLoader(ds, FANOUT, transport, layout=layout, batch_size=8, prefetch=0,
                                                    neg_sampling=dict(mode="binary", amount=1), **options))


class ranks:
    """``world`` ranks over ``ds`` in this process (loopback transport, a partition server each): rank 0's
    transport and the layout."""

    def __init__(self, ds: Any, world: int) -> None:
        from graphstore.dataset.rank_layout import RankLayout
        from sampling.distributed.server import PartitionServer
        from sampling.distributed.transport import LoopbackTransport

        self.layout = RankLayout(ds.num_parts, world)
        self.transports = LoopbackTransport.group(world)
        for rank, transport in enumerate(self.transports):
            PartitionServer(ds, self.layout.parts_of(rank)).register(transport)

    def __enter__(self) -> tuple[Any, Any]:
        return self.transports[0], self.layout

    def __exit__(self, *exc: Any) -> None:
        for transport in self.transports:
            transport.shutdown()

