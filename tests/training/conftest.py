"""Helpers to run graphstore-train as a user would: a child process, its output and its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_cmd(dataset, *args) -> list[str]:
    return [sys.executable, "-m", "training.launch", str(dataset), "--no-progress", *map(str, args)]


def run_train(dataset, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(train_cmd(dataset, *args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def metrics(path) -> dict:
    return json.loads(Path(path).read_text())


def opened_under(pids, root: str) -> list[str]:
    """Files under ``root`` that any of ``pids`` maps or holds open, read from ``/proc/PID/maps`` and
    ``/proc/PID/fd`` (cheap enough to poll while a job runs; psutil's ``memory_maps`` parses smaps)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                found += [line.split(None, 5)[5].strip() for line in fh if root in line]
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone (or going) meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(root):
                found.append(target)
    return [path for path in found if path.startswith(root)]


@pytest.fixture(scope="session")
def cora2(tmp_path_factory):
    """Cora in 2 METIS partitions."""
    import graphstore
    from tests.conftest import shared_data

    raw = shared_data("planetoid", "Cora", "raw")
    dest = tmp_path_factory.mktemp("cora") / "cora2"
    graphstore.ingest(f"planetoid:{raw}", dest, num_parts=2)
    return dest


def synthetic_source(n: int = 2000, classes: int = 4, seed: int = 0):
    """A small labelled graph needing no real data: features weakly informative of the label, 80% of
    each node's 8 in-edges from its own class (so neighbours add signal), train/val/test masks split
    evenly between the two halves of the ID range (range partitioning gives every rank the same steps)."""
    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (np.eye(classes)[y] + rng.normal(0, 1.5, (n, classes))).astype(np.float32)
    by_class = [np.flatnonzero(y == c) for c in range(classes)]
    dst = np.repeat(np.arange(n), 8)
    same = rng.random(len(dst)) < 0.8
    src = rng.integers(0, n, len(dst))
    for c in range(classes):
        pick = same & (y[dst] == c)
        src[pick] = rng.choice(by_class[c], int(pick.sum()))
    slot = np.arange(n) % 10
    masks = {"train_mask": slot < 4, "val_mask": slot == 4, "test_mask": slot >= 5}
    attrs = {"x": ArrayRows(x), "y": ArrayRows(y), **{k: ArrayRows(v) for k, v in masks.items()}}
    return GraphSource({None: NodeTable(n, attrs)}, {None: EdgeTable(src, dst)})


@pytest.fixture(scope="session")
def synthetic2(tmp_path_factory):
    """``synthetic_source()`` in 2 range partitions (1,000 nodes, 400 training nodes each)."""
    import graphstore

    dest = tmp_path_factory.mktemp("synthetic") / "syn2"
    graphstore.ingest(synthetic_source(), dest, num_parts=2, method="range")
    return dest


@pytest.fixture(scope="session")
def synthetic1(tmp_path_factory):
    """``synthetic_source()`` in one partition: several ranks on it sample locally only (reproducible)."""
    import graphstore

    dest = tmp_path_factory.mktemp("synthetic") / "syn1"
    graphstore.ingest(synthetic_source(), dest, num_parts=1)
    return dest


@pytest.fixture(autouse=True)
def _job_logs_in_tmp(monkeypatch, tmp_path_factory) -> None:
    """A failed job keeps its log (GRAPHSTORE_LOG_DIR): under the test's temporary directory, never /tmp."""
    monkeypatch.setenv("GRAPHSTORE_LOG_DIR", str(tmp_path_factory.mktemp("job-logs")))
