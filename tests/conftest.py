"""Shared fixtures: the real-data folder, small graphs with known answers, and a round-trip checker."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

# every child process of the test session (spawned ranks, torchrun, Dask workers) prints its Python stacks
# on a fatal signal: join_spawned sends SIGABRT to a hung worker, so CI shows where it hung
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
# more workers than cores share the machine: torch's OpenMP threads (in the test processes and every rank they
# start) sleep at a barrier instead of spinning, so a waiting thread never takes a core from another test's work
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# GRAPHSTORE_TEST_COMPILES=FILE: each test that compiled kernels in the test process (specialisations the
# warm-up did not cache) appends one JSON line there: what compiled and how long it took. Where the suite's
# time goes besides its jobs; ranks' compiles are their own (their first epoch's record counts them).
COMPILES_ENV = "GRAPHSTORE_TEST_COMPILES"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    path = os.environ.get(COMPILES_ENV)
    if not path:
        yield
        return
    from graphstore.jitcache import compile_counts

    before = compile_counts()
    yield
    got = compile_counts().since(before)
    if got.compiled:
        line = {"test": item.nodeid, "compiled": got.compiled, "seconds": round(got.seconds, 2),
                "kernels": dict(got.names)}
        with open(path, "a") as fh:  # appended whole by each pytest worker
            fh.write(json.dumps(line) + "\n")


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data; skips the test (with the reason) when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present at {path} (a user's checkout without ../shared/data)")
    return path


@dataclass
class Expected:
    """A graph in input IDs, to compare a dataset against: per type node attrs, edges, edge attrs."""

    num_nodes: dict = field(default_factory=dict)  # ntype -> count
    node_attrs: dict = field(default_factory=dict)  # ntype -> {name: array indexed by input ID}
    edges: dict = field(default_factory=dict)  # etype -> (src, dst)
    edge_attrs: dict = field(default_factory=dict)  # etype -> {name: array indexed by input edge ID}


def assert_roundtrip(ds, expected: Expected) -> None:
    """Every node row and every edge of ``expected`` comes back exactly from ``ds`` through orig_id."""
    orig = {}
    for ntype, count in expected.num_nodes.items():
        ids = [ds.partition(p)[0][ntype, "orig_id", None].numpy() for p in range(ds.num_parts)]
        orig[ntype] = np.concatenate(ids)
        assert np.array_equal(np.sort(orig[ntype]), np.arange(count)), f"orig_id of {ntype} is not a permutation"
        offsets = ds.node_offsets(ntype)
        assert [len(i) for i in ids] == np.diff(offsets).tolist()
        for name, values in expected.node_attrs.get(ntype, {}).items():
            got = np.concatenate([ds.partition(p)[0][ntype, name, None].numpy() for p in range(ds.num_parts)])
            assert np.array_equal(got, np.asarray(values)[orig[ntype]]), f"{ntype}.{name} differs"
    for etype, (src, dst) in expected.edges.items():
        s_type, d_type = (None, None) if etype is None else (etype[0], etype[2])
        got_src, got_dst, got_eid, got_attr = [], [], [], {k: [] for k in expected.edge_attrs.get(etype, {})}
        for p in range(ds.num_parts):
            fs, gs = ds.partition(p)
            s, d = gs.get_edge_index(etype, "coo")
            indices, indptr = gs.get_edge_index(etype, "csc")
            assert np.array_equal(indices.numpy(), s.numpy())
            lo, hi = gs.dst_range(etype)
            assert len(indptr) == hi - lo + 1 and int(indptr[-1]) == len(indices)
            assert ((d.numpy() >= lo) & (d.numpy() < hi)).all()
            got_src.append(orig[s_type][s.numpy()])
            got_dst.append(orig[d_type][d.numpy()])
            got_eid.append(gs.edge_ids(etype).numpy())
            for name in got_attr:
                got_attr[name].append(gs.edge_attr(name, etype).numpy())
        eid = np.concatenate(got_eid)
        assert np.array_equal(np.sort(eid), np.arange(len(src))), f"edge IDs of {etype} are not a permutation"
        assert np.array_equal(np.concatenate(got_src), np.asarray(src)[eid])
        assert np.array_equal(np.concatenate(got_dst), np.asarray(dst)[eid])
        for name, parts in got_attr.items():
            assert np.array_equal(np.concatenate(parts), np.asarray(expected.edge_attrs[etype][name])[eid])


def small_graph(n: int = 600, e: int = 4000, seed: int = 0, features: int = 8):
    """A homogeneous GraphSource with x, y, masks, edge weight and time, plus its Expected."""
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    nodes = {"x": rng.standard_normal((n, features)).astype(np.float32), "y": rng.integers(0, 4, n),
             "train_mask": rng.random(n) < 0.5, "time": rng.integers(0, 100, n)}
    edges = {"weight": rng.random(e).astype(np.float32), "time": rng.integers(0, 100, e)}
    source = GraphSource({None: NodeTable(n, {k: ArrayRows(v) for k, v in nodes.items()})},
                         {None: EdgeTable(src, dst, {k: ArrayRows(v) for k, v in edges.items()})}, name="small")
    return source, Expected({None: n}, {None: nodes}, {None: (src, dst)}, {None: edges})


def small_hetero(seed: int = 0):
    """A PyG HeteroData with two node types and three edge types, plus its Expected."""
    import torch
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(300, 6, generator=g)
    data["paper"].y = torch.randint(0, 3, (300,), generator=g)
    data["paper"].train_mask = torch.rand(300, generator=g) < 0.3
    data["author"].x = torch.randn(120, 4, generator=g)
    cites = torch.randint(0, 300, (2, 1500), generator=g)
    writes = torch.stack([torch.randint(0, 120, (800,), generator=g), torch.randint(0, 300, (800,), generator=g)])
    data["paper", "cites", "paper"].edge_index = cites
    data["paper", "cites", "paper"].edge_attr = torch.randn(1500, 2, generator=g)
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    expected = Expected(
        {"paper": 300, "author": 120},
        {"paper": {k: data["paper"][k].numpy() for k in ("x", "y", "train_mask")}, "author": {"x": data["author"].x.numpy()}},
        {et: (data[et].edge_index[0].numpy(), data[et].edge_index[1].numpy()) for et in data.edge_types},
        {("paper", "cites", "paper"): {"edge_attr": data["paper", "cites", "paper"].edge_attr.numpy()}},
    )
    return data, expected


# what spawned ranks import before their function runs: the fork server imports it once per test process
RANK_PRELOAD = ["torch", "torch_geometric", "torch.distributed.rpc", "graphstore", "sampling.distributed.server",
                "training.loop.trainer", "training.cluster.process_groups"]


def spawn_ranks(fn, args: tuple, nprocs: int):
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=False)``, with the processes forked from Python's fork
    server (one a test process, started with the first call) once it has imported torch, PyG and the trainer:
    each rank starts without importing them again. Each still runs ``fn(i, *args)`` in a process of its own,
    single-threaded at the fork, as a spawned one would; join with :func:`join_spawned`."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)  # read when the server starts
    return mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="forkserver")


def join_spawned(ctx, seconds: float = 120, reports=()) -> None:
    """Join ``torch.multiprocessing.spawn(..., join=False)`` workers with a hard bound: a hang kills them and
    fails the test instead of eating CI (``join()`` returns after each exit, so it is called in a loop).
    Workers still running at the bound first get SIGABRT, so faulthandler (``PYTHONFAULTHANDLER``, set for
    every child of this session) prints where each of them hung into the test's captured stderr; the files in
    ``reports`` that the workers wrote (their results or errors) are quoted in the failure."""
    import signal
    import time

    deadline = time.monotonic() + seconds
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            hung = [i for i, proc in enumerate(ctx.processes) if proc.is_alive()]
            for i in hung:
                os.kill(ctx.processes[i].pid, signal.SIGABRT)
            for proc in ctx.processes:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
            written = "".join(f"\n{path}:\n{Path(path).read_text()}" for path in reports if Path(path).exists())
            pytest.fail(f"spawned workers {hung} (of {len(ctx.processes)}) did not finish within {seconds:.0f} s; "
                        f"their stacks are in the captured stderr{written}")


def features_only_accuracy(dataset, epochs: int = 300) -> float:
    """The baseline a GNN must beat: logistic regression on the node features alone (no edges), trained
    on ``train_mask``, scored on ``test_mask`` of the same dataset (homogeneous, every partition)."""
    import torch

    from graphstore.dataset.whole import DatasetFeatureStore

    fs = DatasetFeatureStore(dataset)
    x, y = fs[None, "x", None].float(), fs[None, "y", None].long()
    train, test = fs[None, "train_mask", None].bool(), fs[None, "test_mask", None].bool()
    x = (x - x[train].mean(0)) / x[train].std(0).clamp_min(1e-6)
    torch.manual_seed(0)
    model = torch.nn.Linear(x.size(1), int(y.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[train]), y[train]).backward()
        optimizer.step()
    with torch.no_grad():
        return float((model(x[test]).argmax(-1) == y[test]).float().mean())


@pytest.fixture
def rig():
    """Make multi-host rigs: ``rig(n)`` gives a :class:`tests.cluster.Cluster` of ``n`` namespaces, all
    removed after the test. Skips only where root or iproute2 is missing, and fails then under ``CI=true``."""
    from tests.cluster import Cluster, require_rig, rig_unavailable

    require_rig(rig_unavailable(), dict(os.environ))
    made: list[Cluster] = []

    def make(n: int) -> Cluster:
        made.append(Cluster(n))
        return made[-1]

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()


def running(procs: list) -> list:
    """Of ``procs`` (``psutil.Process`` objects or PIDs), those still running: not ended, not a zombie
    (a process that ends while it is asked counts as ended)."""
    import psutil

    alive = []
    for p in procs:
        try:
            proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def started_together(argvs: list[list[str]], gate: Path, ready: int, env: dict | None = None,
                     timeout: float = 300) -> tuple[list, list[tuple[str, str]]]:
    """Start each of ``argvs``; once ``ready`` files named ``<gate>.ready-*`` exist (each process writes its
    own when it is about to race; at most 120 s), create ``gate`` so they go on together. Returns the
    processes and each one's (stdout, stderr); a process still running after ``timeout`` is killed."""
    import subprocess
    import time

    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    try:
        deadline = time.monotonic() + 120
        while len(list(gate.parent.glob(f"{gate.name}.ready-*"))) < ready and time.monotonic() < deadline:
            if not all(p.poll() is None for p in procs):
                break  # one ended before the race: its output says why
            time.sleep(0.01)
        gate.touch()
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return procs, outs
