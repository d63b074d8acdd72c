"""graphstore-train end to end: accuracy, metrics, checkpoints and resume, uneven ranks, dead peers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest

import graphstore
from tests.conftest import features_only_accuracy
from tests.training.conftest import ROOT, metrics, run_train, train_cmd

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_two_ranks_on_cora_reach_the_known_accuracy(cora2, tmp_path):
    out = run_train(cora2, "--nproc", 2, "--epochs", 8, "--eval-every", 8, "--fanout", "10,10", "--batch-size", 32,
                    "--lr", 0.01, "--hidden", 64, "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    assert doc["world_size"] == 2 and doc["num_parts"] == 2 and len(doc["epochs"]) == 8
    last = doc["epochs"][-1]
    baseline = features_only_accuracy(graphstore.open_dataset(cora2))  # about 0.45 on Cora's public split
    # this command's test accuracy over --seed 0..3 with one sampling engine: 0.749, 0.795, 0.764, 0.795; the
    # floor sits below that spread (a seed's draw is not a regression) and far above the features-only baseline
    assert last["test_acc"] >= max(0.74, baseline + 0.15), (baseline, last)
    assert last["remote"]["requests"] > 0, "two partitions must talk"
    for key in ("sampling", "feature_fetch", "forward_backward", "grad_sync", "data_wait", "remote_wait"):
        assert key in last["timing"]
    assert "epoch 8/8" in out.stdout


def test_synthetic_default_graph_learns(tmp_path):
    spec = "synthetic:nodes=6000,avg_degree=10,features=16,classes=4,seed=0"
    graphstore.ingest(spec, tmp_path / "syn", num_parts=2)
    out = run_train(tmp_path / "syn", "--epochs", 3, "--fanout", "10,5", "--batch-size", 256, "--lr", 0.01,
                    "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    baseline = features_only_accuracy(graphstore.open_dataset(tmp_path / "syn"))  # about 0.83 here
    test_acc = metrics(tmp_path / "m.json")["epochs"][-1]["test_acc"]  # about 0.98
    assert test_acc >= baseline + 0.08, f"the graph must add to the features: {test_acc} vs {baseline}"


def test_ranks_with_very_uneven_training_nodes_finish(tmp_path):
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(0)
    n = 2000
    train = np.zeros(n, bool)
    train[:900] = True  # range partitioning: partition 0 gets 900 training nodes, partition 1 gets 3
    train[1500:1503] = True
    y = rng.integers(0, 3, n)
    x = (np.eye(3)[y] + rng.normal(0, 1, (n, 3))).astype(np.float32)
    src, dst = rng.integers(0, n, 10000), rng.integers(0, n, 10000)
    source = GraphSource({None: NodeTable(n, {"x": ArrayRows(x), "y": ArrayRows(y), "train_mask": ArrayRows(train)})},
                         {None: EdgeTable(src, dst)})
    graphstore.ingest(source, tmp_path / "uneven", num_parts=2, method="range")
    out = run_train(tmp_path / "uneven", "--epochs", 2, "--batch-size", 64, "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    assert metrics(tmp_path / "m.json")["epochs"][-1]["steps"] == 15  # ceil(900 / 64): the busier rank sets it


@pytest.fixture(scope="module")
def synthetic4(tmp_path_factory):
    """``synthetic_source()`` in 4 METIS partitions."""
    from tests.training.conftest import synthetic_source

    dest = tmp_path_factory.mktemp("synthetic") / "syn4"
    graphstore.ingest(synthetic_source(), dest, num_parts=4)
    return dest


def test_four_partitions_train_on_any_rank_count(synthetic4, tmp_path):
    """Fewer ranks than partitions (each owns several, from storage) train as well as one per partition.
    3 ranks cover a rank owning several partitions beside ranks owning one (2 ranks, two each, add
    nothing to it); 1 rank owns every partition and asks no peer."""
    acc = {}
    for nproc in (4, 3, 1):
        out = run_train(synthetic4, "--nproc", nproc, "--epochs", 3, "--eval-every", 3, "--fanout", "5,5",
                        "--batch-size", 64, "--lr", 0.01, "--metrics-out", tmp_path / f"{nproc}.json")
        assert out.returncode == 0, out.stderr
        doc = metrics(tmp_path / f"{nproc}.json")
        assert doc["world_size"] == nproc and doc["num_parts"] == 4
        acc[nproc] = doc["epochs"][-1]["test_acc"]
        assert (doc["epochs"][-1]["remote"]["requests"] > 0) == (nproc > 1), "one rank owns every partition"
    assert min(acc.values()) >= acc[4] - 0.03, acc


def test_a_killed_rank_ends_the_job_with_its_name(synthetic2, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = train_cmd(synthetic2, "--nproc", 2, "--epochs", 200, "--eval-every", 200, "--fanout", "10,10",
                    "--batch-size", 8, "--timeout", 20)
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        ranks = _wait_for_ranks(launcher, 2)
        line = launcher.stdout.readline()  # the first epoch is done: training is under way
        assert line.startswith("epoch 1/"), line
        os.kill(ranks[1].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = launcher.communicate(timeout=90)
        elapsed = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert "rank 1 exited with signal SIGKILL" in err
    # the survivor names the dead rank, whether an RPC or a collective noticed first
    assert re.search(r"rank 0 at [^:]+: lost rank 1 at 127\.0\.0\.1 ", err), err
    assert elapsed < 60, f"the job took {elapsed:.0f} s to stop"
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "a rank was left behind"


def _wait_for_ranks(launcher: subprocess.Popen, count: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = []
        for p in psutil.Process(launcher.pid).children():  # not the fork server the ranks come from
            with contextlib.suppress(psutil.Error):
                if "--rank-from-env" in p.cmdline():
                    children.append(p)
        if len(children) == count:
            return sorted(children, key=lambda p: p.environ().get("GRAPHSTORE_RANK", "0"))
        time.sleep(0.1)
    raise AssertionError("the launcher did not start its ranks")


def test_the_same_entry_point_runs_under_torchrun(cora2, tmp_path):
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("torchrun")  # the same program as python -m torch.distributed.run
    torchrun = [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*torchrun, "--standalone", "--nproc-per-node", "2", "-m", "training.launch",
                          str(cora2), "--epochs", "2", "--fanout", "10,10", "--batch-size", "32", "--no-progress",
                          "--metrics-out", str(tmp_path / "m.json")], capture_output=True, text=True, timeout=300,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = metrics(tmp_path / "m.json")
    assert doc["world_size"] == 2 and doc["epochs"][-1]["remote"]["requests"] > 0
