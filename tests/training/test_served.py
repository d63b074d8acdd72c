"""Server-client mode as users run it: two ``graphstore serve`` processes hold Cora's two partitions, and
``graphstore-train --servers`` trains from them without opening a file of the dataset."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.training.conftest import ROOT, metrics, opened_under
from training.cluster.world import free_port

BIN = Path(sys.executable).parent


def _opened_dataset(pid: int, root: str) -> list[str]:
    """Files under ``root`` that process ``pid`` or its children map or hold open."""
    try:
        procs = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
    return opened_under(procs, root)


def _train(cora2, address, tmp_path, name, *args) -> tuple[list[str], str, dict]:
    """``graphstore-train --servers`` to the end (bounded); what its processes opened of the dataset, its
    output, and its metrics."""
    out_file = tmp_path / f"{name}.json"
    seen, out = _watched([str(BIN / "graphstore-train"), str(cora2), "--servers", address, "--timeout", "60",
                          "--no-progress", "--metrics-out", str(out_file), *map(str, args)], cora2)
    return seen, out, metrics(out_file)


def _watched(cmd: list[str], cora2) -> tuple[list[str], str]:
    """``cmd`` to the end (bounded, exit 0 asserted): what its processes opened of the dataset, its output."""
    trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 240
        while trainer.poll() is None and time.monotonic() < deadline:  # the trainer's processes, while they train
            seen += _opened_dataset(trainer.pid, str(cora2))
            time.sleep(0.2)
        out = trainer.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
    assert trainer.returncode == 0, out
    return seen, out


@pytest.mark.slow
def test_kept_sampler_servers_train_links_on_two_trainer_ranks_that_open_no_file(cora2, tmp_path):
    """Two servers kept serving (``--keep-serving``) train a link job on 2 trainer ranks: triplet negatives,
    the split computed on the servers by ingest's rule (Cora stores none); then a node job of one's own script
    through ``graphstore-run --servers``; SIGTERM then stops them, 0. (Node
    classification through servers on hosts of their own: tests/training/test_multihost.py.)"""
    port = free_port()
    address = f"127.0.0.1:{port}"
    servers = [subprocess.Popen([str(BIN / "graphstore"), "serve", str(cora2), "--address", address, "--servers", "2",
                                 "--rank", str(rank), "--timeout", "60", "--keep-serving"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        seen, out, doc = _train(cora2, address, tmp_path, "link", "--task", "link", "--neg-sampling", "triplet",
                                "--nproc", 2, "--epochs", 1, "--fanout", "5,5", "--batch-size", 256)
        assert seen == []
        assert doc["world_size"] == 2 and len(doc["epochs"]) == 1
        assert doc["epochs"][-1]["test_mrr"] >= 0.7, doc["epochs"][-1]  # 5 negatives each: chance is 0.41
        assert doc["epochs"][-1]["wire"]["bytes"]["batch"] > 0  # the batches came over the servers' connections
        # the next job on the same servers: a script of one's own, unchanged (no servers= in it), given the
        # servers by graphstore-run; it trains from them and opens no file of the dataset it names
        seen, out = _watched([str(BIN / "graphstore-run"), "--servers", address, "--timeout", "60",
                              str(ROOT / "examples" / "node_classification.py"), str(cora2), "--epochs", "1",
                              "--checkpoint", str(tmp_path / "node.ckpt")], cora2)
        assert seen == [], seen
        assert len(re.findall(r"^epoch \d+ loss [0-9.]+ test_acc [0-9.]+$", out, re.M)) == 1, out
        for server in servers:
            assert server.poll() is None, server.communicate()[0]  # still serving: --keep-serving
            server.send_signal(signal.SIGTERM)
        for rank, server in enumerate(servers):
            log = server.communicate(timeout=60)[0]
            assert server.returncode == 0, log
            assert f"sampler server {rank}: the 2 trainer(s) of job" in log and "stopped by signal" in log, log
            assert f"sampler server {rank}: the 1 trainer(s) of job" in log, log  # graphstore-run's job
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_a_request_that_failed_on_a_lost_peer_server_names_that_server_and_its_host(monkeypatch):
    from sampling.distributed.transport import PeerError
    from training.cluster import process_groups
    from training.serve import lost_server

    monkeypatch.setitem(process_groups.HOSTS, 1, "10.0.0.2 (node7)")
    lost = PeerError("rank 1 did not answer 'graphstore.sample' (dead, unreachable, or slower than the 5 s timeout)")
    lost.peer = 1
    told = lost_server(lost, 0)
    assert str(told).startswith("sampler server 0 lost sampler server 1 at 10.0.0.2 (node7) while sampling")
    failed = PeerError("rank 1 failed in 'graphstore.sample': ValueError: bad")  # its handler raised: not lost
    failed.peer = 1
    assert lost_server(failed, 0) is failed
