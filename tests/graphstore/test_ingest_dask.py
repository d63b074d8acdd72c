"""The Dask engine: same dataset as the local engine, worker deaths retried or named, S3 DEST, bad arguments."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import zarr

import graphstore
from graphstore.dataset import layout
from graphstore.errors import DatasetNotFoundError, IngestStageError, InvalidInputError
from graphstore.ingest.chunked_graph import chunked_from_graph
from graphstore.ingest.engine import LocalEngine, engine_for
from graphstore.storage.local import is_dataset, open_location
from tests.conftest import assert_roundtrip, small_graph
from tests.graphstore.conftest import ACCESS_KEY, SECRET_KEY

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.distributed

EQUIV_GRAPH = "synthetic:nodes=200000,avg_degree=10,features=8,classes=4"


def _cluster():
    """Two worker processes, one thread each; a worker that dies once more than allowed ends its task."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GB",
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as c:
            yield c


@pytest.fixture(scope="module")
def client():
    """The cluster most tests share; no test kills its workers."""
    yield from _cluster()


@pytest.fixture
def doomed_client():
    """A cluster of the test's own, for tests that kill workers: restarted workers come back at their own
    pace (and a worker plugin may outlive its unregistering), so the shared cluster never sees a kill."""
    yield from _cluster()


class KillOnStage(distributed.WorkerPlugin):
    """Kills its worker process when a task of ``stage`` starts, at most ``times`` times (counted in files)."""

    def __init__(self, stage: str, marker_dir: str, times: int) -> None:
        self.stage, self.marker_dir, self.times = stage, marker_dir, times

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish != "executing" or not str(key).startswith(f"{self.stage}-"):
            return
        deaths = len(os.listdir(self.marker_dir))
        if deaths < self.times:
            open(os.path.join(self.marker_dir, f"death-{deaths}"), "w").close()
            os._exit(1)


def _stored(path: str) -> dict[str, bytes]:
    """Every stored file of a dataset, by relative path; the manifest without its creation time."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), path)
            out[rel] = open(os.path.join(root, name), "rb").read()
    manifest = graphstore.open_dataset(path).manifest.to_json()
    manifest["provenance"].pop("created"), manifest["provenance"].pop("seconds")
    out[layout.ROOT_METADATA] = repr(manifest).encode()
    return out


def _by_orig_id(path: str) -> tuple[set[tuple[int, int]], dict[int, bytes]]:
    """Edges as (orig src, orig dst) and node feature rows by orig ID: a checker that ignores the layout."""
    group = zarr.open_group(path, mode="r")
    edges, rows = set(), {}
    ds = graphstore.open_dataset(path)
    order = np.concatenate([group[f"part_{p:05d}/nodes/{layout.HOMOGENEOUS_KEY}/orig_id"][:]
                            for p in range(ds.manifest.num_parts)])
    for p in range(ds.manifest.num_parts):
        prefix = f"part_{p:05d}/edges/{layout.HOMOGENEOUS_KEY}"
        indptr, indices = group[f"{prefix}/indptr"][:], group[f"{prefix}/indices"][:]
        dst = np.repeat(np.arange(len(indptr) - 1) + ds.manifest.node_types[0].offsets[p], np.diff(indptr))
        edges |= set(zip(order[indices].tolist(), order[dst].tolist()))
        x = group[f"part_{p:05d}/nodes/{layout.HOMOGENEOUS_KEY}/x"][:]
        ids = group[f"part_{p:05d}/nodes/{layout.HOMOGENEOUS_KEY}/orig_id"][:]
        rows.update({int(i): r.tobytes() for i, r in zip(ids, x)})
    return edges, rows


def test_dask_gives_the_local_dataset_byte_for_byte(client, tmp_path):
    local, on_dask = str(tmp_path / "local"), str(tmp_path / "dask")
    graphstore.ingest(EQUIV_GRAPH, local, num_parts=2, method="random", seed=1)
    graphstore.ingest(EQUIV_GRAPH, on_dask, num_parts=2, method="random", seed=1, engine="dask", client=client)
    assert _stored(local) == _stored(on_dask)
    edges, rows = _by_orig_id(on_dask)
    assert (edges, rows) == _by_orig_id(local)
    assert len(rows) == 200_000 and len(edges) > 1_000_000
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging or routing left


def test_a_worker_killed_once_is_retried_and_changes_nothing(doomed_client, tmp_path):
    client = doomed_client
    source, expected = small_graph(n=3000, e=20000, seed=2)
    graphstore.ingest(source, str(tmp_path / "local"), num_parts=3, method="random", seed=1)
    (tmp_path / "deaths").mkdir()
    client.register_plugin(KillOnStage("edges", str(tmp_path / "deaths"), times=1), name="kill")
    try:
        source, _ = small_graph(n=3000, e=20000, seed=2)
        graphstore.ingest(source, str(tmp_path / "dask"), num_parts=3, method="random", seed=1, engine="dask",
                          client=client)
    finally:
        client.unregister_worker_plugin("kill")
    assert len(os.listdir(tmp_path / "deaths")) == 1  # the fault happened
    assert _stored(str(tmp_path / "local")) == _stored(str(tmp_path / "dask"))
    assert_roundtrip(graphstore.open_dataset(str(tmp_path / "dask")), expected)


def test_a_worker_that_keeps_dying_fails_naming_worker_and_stage(doomed_client, tmp_path):
    client = doomed_client
    (tmp_path / "deaths").mkdir()
    client.register_plugin(KillOnStage("route", str(tmp_path / "deaths"), times=100), name="kill-always")
    try:
        with pytest.raises(IngestStageError, match=r"stage 'route'.*worker tcp://") as info:
            graphstore.ingest(small_graph(n=3000, e=20000, seed=2)[0], str(tmp_path / "ds"), num_parts=2,
                              method="random", engine="dask", client=client)
    finally:
        client.unregister_worker_plugin("kill-always")
    assert "died" in str(info.value)
    assert len(os.listdir(tmp_path / "deaths")) >= 2
    assert os.listdir(tmp_path) == ["deaths"]  # nothing at DEST, no staging or routing left
    with pytest.raises(DatasetNotFoundError):
        graphstore.open_dataset(str(tmp_path / "ds"))


@pytest.mark.s3
def test_s3_dest_written_by_the_workers(client, s3):
    options = {**s3.storage_options, "key": ACCESS_KEY, "secret": SECRET_KEY}  # the workers' credentials
    source, expected = small_graph(n=2000, e=12000, seed=5)
    url = s3.url("on-dask")
    graphstore.ingest(source, url, num_parts=2, method="metis", engine="dask", client=client, storage_options=options)
    assert_roundtrip(graphstore.open_dataset(url, options), expected)
    assert graphstore.open_dataset(url, options).verify() == []
    assert not [k for k in s3.fs().find(s3.bucket) if ".routing-" in k]


@pytest.mark.s3
def test_failed_dask_ingest_on_s3_leaves_nothing_that_opens(client, s3, tmp_path):
    options = {**s3.storage_options, "key": ACCESS_KEY, "secret": SECRET_KEY}
    (tmp_path / "deaths").mkdir()
    client.register_plugin(KillOnStage("edges", str(tmp_path / "deaths"), times=100), name="kill-s3")
    try:
        with pytest.raises(IngestStageError, match="stage 'edges'"):
            graphstore.ingest(small_graph(n=2000, e=12000, seed=5)[0], s3.url("dies"), num_parts=2,
                              method="random", engine="dask", client=client, storage_options=options)
    finally:
        client.unregister_worker_plugin("kill-s3")
    assert not is_dataset(open_location(s3.url("dies"), options))
    assert s3.fs().find(f"{s3.bucket}/dies") == []


def test_bad_engine_arguments_are_refused_before_any_work(client, tmp_path):
    dest = str(tmp_path / "ds")
    with pytest.raises(InvalidInputError, match="'spark' is not one of"):
        graphstore.ingest("synthetic:nodes=100,avg_degree=2", dest, engine="spark")
    with pytest.raises(InvalidInputError, match="engine='local' runs in this process"):
        graphstore.ingest("synthetic:nodes=100,avg_degree=2", dest, client=client)
    with pytest.raises(InvalidInputError, match="needs client="):
        graphstore.ingest("synthetic:nodes=100,avg_degree=2", dest, engine="dask")
    with pytest.raises(InvalidInputError, match="not a distributed.Client"):
        graphstore.ingest("synthetic:nodes=100,avg_degree=2", dest, engine="dask", client="tcp://x:8786")
    assert not os.path.exists(dest)
    assert isinstance(engine_for("local"), LocalEngine)


def test_a_cluster_without_workers_is_waited_for_then_named(tmp_path):
    from graphstore.ingest.budget import dask_budget

    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        with pytest.raises(InvalidInputError, match=r"has no workers \(waited 1 s\); start workers"):
            dask_budget(c, wait=1)
        cluster.scale(1)  # a worker that joins while the ingest waits (restarting after a death, say) is used
        assert dask_budget(c, wait=60).task_bytes > 0


def test_chunks_cover_every_edge_once_and_pickle_only_their_rows():
    import pickle

    source, _ = small_graph(n=500, e=2001, seed=1)
    chunked = chunked_from_graph(source, 700)
    assert [(c.start, c.stop) for c in chunked.edge_chunks] == [(0, 700), (700, 1400), (1400, 2001)]
    table = source.edges[None]
    for chunk in chunked.edge_chunks:
        block = pickle.loads(pickle.dumps(chunk)).read()
        assert np.array_equal(block.src, table.src[chunk.start: chunk.stop])
        for name, rows in table.attrs.items():
            assert np.array_equal(block.attrs[name], rows.take(np.arange(chunk.start, chunk.stop)))
    assert len(pickle.dumps(chunked.edge_chunks[0])) < 0.5 * len(pickle.dumps(table))  # 700 of 2001 edges
    with pytest.raises(InvalidInputError, match="chunk_edges=0"):
        chunked_from_graph(source, 0)


def test_cli_dask_flags_that_do_not_apply_are_refused(tmp_path, capsys):
    from graphstore.cli.app import main

    src, dest = "synthetic:nodes=100,avg_degree=2", str(tmp_path / "ds")
    cases = {("--workers", "2"): "apply only to --engine dask",
             ("--memory-limit", "1GB"): "apply only to --engine dask",
             ("--scheduler", "tcp://127.0.0.1:1"): "apply only to --engine dask",
             ("--engine", "dask", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"): "joins a running one",
             ("--engine", "dask", "--memory-limit", "lots"): "'lots' is not a size",
             ("--engine", "dask", "--workers", "0"): "at least 1 worker",
             ("--engine", "dask", "--scheduler", "tcp://10.1.2.3:8786"): "is a local path, but --scheduler"}
    for flags, message in cases.items():
        assert main(["ingest", src, dest, *flags]) != 0, flags
        assert message in capsys.readouterr().err, flags
    assert not os.path.exists(dest)


def test_cli_engine_dask_starts_a_cluster_and_closes_it(tmp_path, capsys):
    from graphstore.cli.app import main

    dest = str(tmp_path / "ds")
    argv = ["ingest", "synthetic:nodes=3000,avg_degree=6,features=4,classes=3", dest, "--parts", "2", "--method",
            "random", "--seed", "1"]
    assert main([*argv, "--engine", "dask", "--workers", "1", "--memory-limit", "1GB"]) == 0
    assert "dask dashboard:" in capsys.readouterr().err
    assert main([*argv[:2], str(tmp_path / "local"), *argv[3:]]) == 0
    assert _stored(dest) == _stored(str(tmp_path / "local"))
    assert graphstore.open_dataset(dest).verify() == []


def test_progress_reports_every_edge_of_both_edge_stages(client, tmp_path):
    calls = []
    source, _ = small_graph(n=3000, e=20000, seed=2)
    graphstore.ingest(source, str(tmp_path / "ds"), num_parts=3, method="random", engine="dask", client=client,
                      progress=lambda stage, done, total: calls.append((stage, done, total)))
    for stage in ("route", "edges"):
        done = [c for c in calls if c[0] == stage]
        assert sum(d for _, d, _ in done) == 20000 and {t for _, _, t in done} == {20000}, stage


def test_parquet_source_read_by_the_workers_gives_the_local_dataset(client, tmp_path):
    from tests.graphstore.test_read_parquet import _expected, _graph, _write

    g = _graph(7)  # unsorted, negative, sparse node IDs
    src = _write(tmp_path / "in", g)
    for engine, extra in (("local", {}), ("dask", {"client": client})):
        graphstore.ingest(f"parquet:{src}", tmp_path / engine, num_parts=3, method="metis", engine=engine, **extra)
    assert _stored(str(tmp_path / "local")) == _stored(str(tmp_path / "dask"))
    assert_roundtrip(graphstore.open_dataset(tmp_path / "dask"), _expected(g))
