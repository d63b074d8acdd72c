"""``graphstore.ingest`` arguments: ``to_undirected`` for every source; Dask flags checked at the door."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import threading
import time

import pytest
import torch
from torch_geometric.data import Data

import graphstore
from graphstore.cli.app import main
from graphstore.cli.dask_options import MIN_MEMORY_LIMIT, dask_client
from graphstore.errors import UnreachableHostError
from graphstore.dataset.whole import DatasetFeatureStore, DatasetGraphStore
from tests.conftest import small_graph


def _edge_set(ds) -> set[tuple[int, int]]:
    orig = DatasetFeatureStore(ds)[None, "orig_id", None].numpy()  # global -> input ID
    src, dst = DatasetGraphStore(ds).get_edge_index(None, "coo")
    return set(zip(orig[src.numpy()].tolist(), orig[dst.numpy()].tolist()))


def test_to_undirected_applies_to_in_memory_sources(tmp_path):
    ei = torch.tensor([[0, 1, 2, 4], [1, 2, 3, 0]])
    data = Data(edge_index=ei, num_nodes=5)
    graphstore.ingest(data, tmp_path / "a", to_undirected=True)
    want = {(s, d) for s, d in ei.t().tolist()} | {(d, s) for s, d in ei.t().tolist()}
    assert _edge_set(graphstore.open_dataset(tmp_path / "a")) == want
    graphstore.ingest(data, tmp_path / "b")
    assert _edge_set(graphstore.open_dataset(tmp_path / "b")) == {(s, d) for s, d in ei.t().tolist()}

    source, expected = small_graph(n=50, e=120)
    before = source.edges[None].num_edges
    graphstore.ingest(source, tmp_path / "c", to_undirected=True)
    assert source.edges[None].num_edges == before  # the caller's source is left as it was
    src, dst = expected.edges[None]
    ds = graphstore.open_dataset(tmp_path / "c")
    assert ds.manifest.edge_types[0].num_edges == 2 * len(src)
    assert _edge_set(ds) == set(zip(src.tolist(), dst.tolist())) | set(zip(dst.tolist(), src.tolist()))


@pytest.fixture
def not_dask():
    """A TCP port where something that is not a Dask scheduler answers (an HTTP server, say)."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_a_scheduler_address_where_another_service_answers_is_one_line(tmp_path, capsys, not_dask):
    started = time.monotonic()
    assert main(["ingest", "synthetic:nodes=100", str(tmp_path / "ds"), "--engine", "dask", "--scheduler",
                 not_dask]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--scheduler {not_dask}: no Dask scheduler answered" in err, err
    assert time.monotonic() - started < 60  # bounded by the connect timeout, never a hang
    assert os.listdir(tmp_path) == []


@pytest.fixture
def silent():
    """A TCP port where something accepts connections and never says a word (a Dask scheduler greets first)."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


def test_a_scheduler_address_that_accepts_and_stays_silent_is_named_within_the_connect_bound(
        tmp_path, capsys, monkeypatch, silent):
    from graphstore.cli import dask_options as cli_dask

    monkeypatch.setattr(cli_dask, "CONNECT_SECONDS", 1)  # the bound the docs promise, shortened for the test
    assert main(["ingest", "synthetic:nodes=100", str(tmp_path / "ds"), "--engine", "dask", "--scheduler",
                 silent]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--scheduler {silent}: no Dask scheduler answered" in err, err
    assert "it said nothing in 1 s" in err and os.listdir(tmp_path) == [], err


@pytest.mark.parametrize("verbose,level", [(False, logging.WARNING), (True, logging.INFO)])
def test_dask_logs_info_only_with_verbose(not_dask, verbose, level):
    import distributed  # noqa: F401  (sets the level of its loggers to INFO when imported)

    logger = logging.getLogger("distributed")
    before = logger.level
    logger.setLevel(logging.INFO)
    args = argparse.Namespace(engine="dask", scheduler=not_dask, workers=None, memory_limit=None, verbose=verbose)
    try:
        with pytest.raises(UnreachableHostError), dask_client(args):
            pass
        assert logger.getEffectiveLevel() == level
    finally:
        logger.setLevel(before)


def test_memory_limit_minimum_is_what_a_worker_needs():
    from graphstore.ingest.budget import MIN_TASK_BYTES, Budget

    assert Budget.from_process_limit(MIN_MEMORY_LIMIT).task_bytes >= MIN_TASK_BYTES
    assert MIN_MEMORY_LIMIT >> 20 == 328  # the number the refusal names


def test_parents_creates_missing_directories_only_when_asked(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="pass --parents"):
        graphstore.ingest("synthetic:nodes=100", tmp_path / "a" / "ds")
    assert os.listdir(tmp_path) == []
    graphstore.ingest("synthetic:nodes=100", tmp_path / "a" / "ds", parents=True)
    assert main(["ingest", "synthetic:nodes=100", str(tmp_path / "b" / "c" / "ds"), "--parents", "--json"]) == 0
    for path in ("a/ds", "b/c/ds"):
        assert graphstore.open_dataset(tmp_path / path).num_nodes() == 100


@pytest.mark.parametrize("error,words", [
    (TimeoutError("timed out"), "cannot connect to 10.9.9.9:8786 (no answer in 5 s)"),
    (socket.gaierror(-2, "Name or service not known"), "(Name or service not known)"),
    (ConnectionRefusedError(111, "Connection refused"), "(Connection refused); start a Dask scheduler there"),
])
def test_scheduler_probe_names_the_address_and_the_fix(monkeypatch, error, words):
    from graphstore.cli import dask_options as cli_dask

    def connect(address, timeout):
        assert timeout == cli_dask.CONNECT_SECONDS
        raise error

    monkeypatch.setattr(cli_dask.socket, "create_connection", connect)
    with pytest.raises(UnreachableHostError) as info:
        cli_dask._probe("10.9.9.9")  # no scheme, no port: tcp:// and Dask's 8786
    assert words in str(info.value) and "--scheduler 10.9.9.9" in str(info.value), str(info.value)
