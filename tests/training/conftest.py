"""Helpers to run graphstore-train as a user would: a child process, its output and its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_cmd(dataset, *args) -> list[str]:
    return [sys.executable, "-m", "training.launch", str(dataset), "--no-progress", *map(str, args)]


def run_train(dataset, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(train_cmd(dataset, *args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def metrics(path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def cora2(tmp_path_factory):
    """Cora in 2 METIS partitions."""
    import graphstore
    from tests.conftest import shared_data

    raw = shared_data("planetoid", "Cora", "raw")
    dest = tmp_path_factory.mktemp("cora") / "cora2"
    graphstore.ingest(f"planetoid:{raw}", dest, num_parts=2)
    return dest


@pytest.fixture(autouse=True)
def _job_logs_in_tmp(monkeypatch, tmp_path_factory) -> None:
    """A failed job keeps its log (GRAPHSTORE_LOG_DIR): under the test's temporary directory, never /tmp."""
    monkeypatch.setenv("GRAPHSTORE_LOG_DIR", str(tmp_path_factory.mktemp("job-logs")))
