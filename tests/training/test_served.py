"""Server-client mode as users run it: two ``graphstore serve`` processes hold Cora's two partitions, and
``graphstore-train --servers`` trains from them without opening a file of the dataset."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.training.conftest import metrics, opened_under
from training.cluster.world import free_port

BIN = Path(sys.executable).parent


def _opened_dataset(pid: int, root: str) -> list[str]:
    """Files under ``root`` that process ``pid`` or its children map or hold open."""
    try:
        procs = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
    return opened_under(procs, root)


def test_a_trainer_of_two_sampler_servers_trains_cora_and_opens_no_file_of_it(cora2, tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    servers = [subprocess.Popen([str(BIN / "graphstore"), "serve", str(cora2), "--address", address, "--servers", "2",
                                 "--rank", str(rank), "--timeout", "60"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    trainer = None
    try:
        trainer = subprocess.Popen([str(BIN / "graphstore-train"), str(cora2), "--servers", address, "--epochs", "3",
                                    "--fanout", "10,5", "--batch-size", "32", "--timeout", "60", "--no-progress",
                                    "--metrics-out", str(tmp_path / "m.json")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: list[str] = []
        deadline = time.monotonic() + 240
        while trainer.poll() is None and time.monotonic() < deadline:  # the trainer's processes, while they train
            seen += _opened_dataset(trainer.pid, str(cora2))
            time.sleep(0.2)
        out = trainer.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        assert trainer.returncode == 0, out
        assert seen == []
        epochs = metrics(tmp_path / "m.json")["epochs"]
        assert len(epochs) == 3 and epochs[-1]["test_acc"] >= 0.6, epochs[-1]
        assert epochs[-1]["wire"]["bytes"]["batch"] > 0  # the batches came over the servers' connections
        for rank, server in enumerate(servers):  # the job is over: each server leaves, 0
            log = server.communicate(timeout=60)[0]
            assert server.returncode == 0, log
            assert f"sampler server {rank}: the 1 trainer(s) of job" in log and "finished" in log
    finally:
        for proc in [*servers, trainer]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
