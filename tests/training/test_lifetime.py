"""A job lives and dies as one: SIGTERM checkpoints and resumes at the exact step, a dead launcher takes its
ranks along, Ctrl-C is one line, a stopped rank is named within the timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from tests.conftest import running
from tests.training.conftest import ROOT, metrics, run_train, train_cmd
from tests.training.test_train import _wait_for_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
# two partitions, so every batch also samples and fetches across ranks over RPC; ~25 steps an epoch
BASE = ("--nproc", 2, "--fanout", "5,5", "--batch-size", 16, "--seed", 3, "--timeout", 20)
FLAGS = (*BASE[:2], "--epochs", 3, *BASE[2:])


def _start(dataset, *args, env=None) -> subprocess.Popen:
    """The launcher as a terminal starts it: SIGINT at its default, so Ctrl-C raises KeyboardInterrupt even
    when this test runs where SIGINT is ignored (a job a shell put in the background inherits that)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(train_cmd(dataset, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _after_epoch_1(launcher: subprocess.Popen) -> None:
    line = launcher.stdout.readline()
    assert line.startswith("epoch 1/3"), line


def test_sigterm_checkpoints_mid_epoch_and_each_resume_ends_as_an_uninterrupted_run(synthetic2, tmp_path):
    """SIGTERM inside epoch 2 checkpoints at that step; resumed, the run ends epoch 3 where an uninterrupted
    run with the same seed does. Resumed again with more epochs (from its end-of-epoch checkpoint), it ends
    epoch 4 with that run's weights, optimizer state and metrics."""
    whole = run_train(synthetic2, *BASE, "--epochs", 4, "--checkpoint-dir", tmp_path / "whole",
                      "--metrics-out", tmp_path / "w.json")
    assert whole.returncode == 0, whole.stderr
    uninterrupted = metrics(tmp_path / "w.json")["epochs"]

    ckpt, m = tmp_path / "cut", tmp_path / "c.json"
    launcher = _start(synthetic2, *FLAGS, "--checkpoint-dir", ckpt, "--metrics-out", m, "--checkpoint-every", 5)
    try:
        _after_epoch_1(launcher)
        steps = uninterrupted[0]["steps"]
        # --checkpoint-every 5 (counted over the run) shows how far epoch 2 got: SIGTERM lands inside it
        first = ckpt / f"checkpoint-epoch0001-step{5 - steps % 5:07d}.pt"
        deadline = time.monotonic() + 60
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = launcher.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 75, err
    assert took < 30, f"stopping took {took:.1f} s"
    assert "stopped on SIGTERM at epoch 2, after step" in err and "--resume" in err, err
    saved = sorted(p.name for p in ckpt.glob("checkpoint-epoch0001-step*.pt"))
    assert saved[0] == first.name, saved
    assert len(metrics(m)["epochs"]) == 1

    keys = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "steps")
    resumed = run_train(synthetic2, *FLAGS, "--checkpoint-dir", ckpt, "--metrics-out", m, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "at epoch 2, step" in resumed.stderr
    got = [{k: e[k] for k in keys} for e in metrics(m)["epochs"]]
    assert got == [{k: e[k] for k in keys} for e in uninterrupted[:3]]
    a, b = (torch.load(d / "checkpoint-epoch0002.pt", weights_only=False) for d in (tmp_path / "whole", ckpt))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key

    more = run_train(synthetic2, *BASE, "--epochs", 4, "--checkpoint-dir", ckpt, "--metrics-out", m, "--resume")
    assert more.returncode == 0, more.stderr
    assert "resumed" in more.stderr and "at epoch 4" in more.stderr, more.stderr
    assert "epoch 3/4" not in more.stdout and "epoch 4/4" in more.stdout
    a, b = (torch.load(d / "checkpoint-epoch0003.pt", weights_only=False) for d in (tmp_path / "whole", ckpt))
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(x[k], y[k]) for k in x)
    got = [{k: e[k] for k in keys} for e in metrics(m)["epochs"]]
    assert got == [{k: e[k] for k in keys} for e in uninterrupted] and [e["epoch"] for e in got] == [1, 2, 3, 4]


@pytest.mark.parametrize("how", ["kill -9", "ctrl-c"])
def test_no_rank_outlives_its_launcher(synthetic2, tmp_path, how):
    (tmp_path / "sys").mkdir()
    launcher = _start(synthetic2, *FLAGS[:2], "--epochs", 200, "--eval-every", 200, "--fanout", "5,5",
                      "--batch-size", 16, env={"TMPDIR": str(tmp_path / "sys")})
    try:
        ranks = _wait_for_ranks(launcher, 2)
        launcher.stdout.readline()  # an epoch is done: training is under way
        launcher.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGINT)
        sent = time.monotonic()
        _, err = launcher.communicate(timeout=30)
        while running(ranks) and time.monotonic() - sent < 15:
            time.sleep(0.2)
        assert not running(ranks), f"ranks alive {time.monotonic() - sent:.0f} s after {how}"
    finally:
        for p in running(ranks if "ranks" in locals() else []):
            p.kill()
        if launcher.poll() is None:
            launcher.kill()
    if how == "ctrl-c":
        assert launcher.returncode == 130
        assert err.strip().splitlines() == ["graphstore-train: interrupted (Ctrl-C); stopped every rank"], err
    deadline = time.monotonic() + 5
    while _job_dirs(tmp_path / "sys") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_dirs(tmp_path / "sys") == [], "the launcher's temporary directory stayed behind"


def _job_dirs(directory) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith("graphstore-train-")]


def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(synthetic2):
    launcher = _start(synthetic2, *FLAGS[:2], "--epochs", 200, "--eval-every", 200, "--fanout", "5,5",
                      "--batch-size", 16, "--timeout", 10)
    ranks = []
    try:
        ranks = _wait_for_ranks(launcher, 2)
        launcher.stdout.readline()
        ranks[1].suspend()
        stopped = time.monotonic()
        _, err = launcher.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        for p in running(ranks):
            p.kill()
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert took < 10 + 15, f"the job took {took:.0f} s to end"
    line = err.strip().splitlines()[-1]
    assert "lost rank 1" in line and "no heartbeat for 10 s" in line, err


_RANK = """
import ctypes, os, sys, time
from training.launcher import lifetime
lifetime.watch_launcher(0)
print("ready", flush=True)
if sys.argv[1] == "gil":
    ctypes.PyDLL(None).sleep(60)  # a C call that keeps the GIL: the watch thread cannot run
else:
    time.sleep(60)
"""
_LAUNCHER = """
import os, subprocess, sys, time
env = {**os.environ, "GRAPHSTORE_LAUNCHER_PID": str(os.getpid()), "GRAPHSTORE_JOB_DIR": sys.argv[1]}
if sys.argv[3] == "python":
    env["PATH"] = ""  # no shell to start a backstop with: only the watch thread can end this rank
# like rank 0's relay: the rank's stderr is a pipe only the launcher reads, broken once the launcher dies
rank = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[3]], env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
print(rank.pid, rank.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("stuck", ["gil", "python"])
def test_a_rank_whose_stderr_was_the_launcher_still_ends_with_it(tmp_path, stuck):
    """The watch thread needs the GIL; the backstop beside the rank (a shell) does not, so a rank stuck in a C
    call is killed about lifetime.BACKSTOP_SECONDS after its launcher dies, and the job directory goes. Both
    must also work when the rank's stderr is a pipe to the dead launcher (rank 0's relay): saying why they
    stop must not stop them (a CI run had rank 0 alive 18 s after kill -9)."""
    from training.launcher import lifetime

    job = tmp_path / "graphstore-train-x"
    job.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(job), _RANK, stuck], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rank = None
    try:
        pid, ready = launcher.stdout.readline().split()
        assert ready == "ready"
        rank = psutil.Process(int(pid))
        launcher.kill()
        launcher.wait(timeout=10)
        killed = time.monotonic()
        # the shell kills the rank, then removes the directory: wait (bounded) for both
        while (running([rank]) or job.exists()) and time.monotonic() - killed < lifetime.BACKSTOP_SECONDS + 10:
            time.sleep(0.1)
        assert not running([rank]), f"the rank is alive {time.monotonic() - killed:.0f} s after its launcher died"
        assert not job.exists(), "the rank is gone but its job directory is still there"
    finally:
        if rank is not None and running([rank]):
            rank.kill()
        if launcher.poll() is None:
            launcher.kill()
