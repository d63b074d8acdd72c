"""Helpers to run graphstore-train as a user would: a child process, its output and its metrics."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_cmd(dataset, *args) -> list[str]:
    return [sys.executable, "-m", "training.launch", str(dataset), "--no-progress", *map(str, args)]


def run_train(dataset, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m training.launch DATASET --no-progress ARGS`` to its end: its exit code and output."""
    return run_launcher(train_cmd(dataset, *args), timeout=timeout)


def run_launcher(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """``cmd`` (``python -m training.launch ...`` or ``python -m training.run ...``) to its end, as
    ``subprocess.run`` with its output captured would run it. The launcher is forked from a process that has
    imported the ranks' modules (``tests/training/zygote.py``), so its rank server is too;
    ``GRAPHSTORE_TEST_ZYGOTE=0`` starts it as a fresh interpreter. ``env``: this process's, with this checkout
    on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env
    if os.environ.get(ZYGOTE_ENV, "1") != "0":
        return _zygote().run(cmd, {**env, FROM_LAUNCHER_ENV: "1"}, Path(cwd), timeout)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


ZYGOTE_ENV = "GRAPHSTORE_TEST_ZYGOTE"
FROM_LAUNCHER_ENV = "GRAPHSTORE_FORK_FROM_LAUNCHER"  # graphstore.forking: the launcher forks the rank server


class Zygote:
    """``tests/training/zygote.py``, started on first use in this test process: runs a job, reads its output."""

    def __init__(self) -> None:
        from training.launch import RANK_IMPORTS  # noqa: F401 - what it imports; the launcher finds them there
        from training.launcher import allocator, forkserver

        # the environment the launcher gives its ranks, where it is read once as a process starts
        env = allocator.preload_env({**os.environ, "PYTHONPATH": str(ROOT)})
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        env[ZYGOTE_ENV + "_ROOM"] = "-" * 16384  # room for a rank's environment in /proc/PID/environ
        rank_cmdline = forkserver._cmdline([sys.executable, "-m", "training.launch", "--rank-from-env"])
        argv = [sys.executable, "-m", "tests.training.zygote"]
        argv.append("-" * max(1, len(rank_cmdline) - len(forkserver._cmdline(argv)) - 1))  # a rank's length
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=ROOT)
        self._pending = b""
        self._expect("ready", 120)
        self.scratch = Path(tempfile.mkdtemp(prefix="graphstore-zygote-"))

    def _expect(self, key: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError(f"the zygote gave no {key!r} within {timeout:.0f} s")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the zygote ended (exit code {self.proc.wait()}) before it gave {key!r}")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        reply = json.loads(line)
        if key not in reply:
            raise RuntimeError(f"the zygote answered {reply!r}, not {key!r}")
        return reply[key]

    def run(self, cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        out, err = self.scratch / "stdout", self.scratch / "stderr"
        request = {"argv": cmd[1:], "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._expect("pid", 30)
        deadline = time.monotonic() + timeout
        try:
            code = self._expect("code", deadline - time.monotonic())
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)  # as subprocess.run's timeout: the launcher, not its ranks
            self._expect("code", 30)
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())

    def close(self) -> None:
        self.proc.stdin.close()  # its loop ends
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


_ZYGOTES: list[Zygote] = []


def _zygote() -> Zygote:
    if _ZYGOTES and _ZYGOTES[0].proc.poll() is not None:  # it died: a new one
        _ZYGOTES.pop().close()
    if not _ZYGOTES:
        _ZYGOTES.append(Zygote())
        atexit.register(_ZYGOTES[0].close)
    return _ZYGOTES[0]


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
