"""Ranks forked from one server process (training.launcher.forkserver): each is what a fresh interpreter
would be (its own environment, argv, session, seed, /proc entries, exit code), adopted by the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graphstore.forking import FORK_RANKS_ENV
from tests.training.conftest import ROOT
from training.launcher import forkserver

PROBE = ["-m", "tests.training.fork_probe", "--flag", "value"]


@pytest.fixture
def server_env():
    """The probe's shared environment; the launcher-side process is the subreaper only inside the test."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    yield env
    forkserver.set_subreaper(False)


def test_forked_ranks_are_the_launchers_children_with_their_own_environment(server_env, tmp_path):
    errs = [open(tmp_path / f"rank{r}.stderr", "w") for r in range(2)]
    envs = [{**server_env, "PROBE_RANK": str(rank), "PROBE_OUT": str(tmp_path / f"rank{rank}.json"),
             "PROBE_EXIT": how} for rank, how in enumerate(("0", "7"))]
    # as the launcher does: the server starts with rank 0's environment (the others differ in a few values)
    server = forkserver.ForkServer(PROBE, envs[0], ("numpy", "tests.training.fork_preloaded"),
                                   [e.fileno() for e in errs])
    ranks = [server.start(PROBE, env, err.fileno()) for env, err in zip(envs, errs)]
    server_pid = server.proc.pid
    server.close()
    assert all(isinstance(r, forkserver.ForkedRank) for r in ranks), server.refusal
    assert [r.wait(timeout=60) for r in ranks] == [0, 7]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, got in enumerate(seen):
        assert got["ppid"] == os.getpid(), "the launcher adopted the rank"
        assert got["sid"] == got["pid"], "a session of its own"
        assert got["rank"] == got["proc_rank"] == str(rank), "its own environment, in /proc too"
        assert got["argv"] == got["proc_cmdline"][2:] == PROBE[2:], got
        assert got["proc_cmdline"][:2] == PROBE[:2]
        assert not got["server_env"]
        assert got["imported_by"] == server_pid, "the module was imported once, by the server"
    assert seen[0]["draw"] != seen[1]["draw"], "each rank seeds NumPy afresh"


def test_the_server_starts_numbas_code_generator_once_and_no_rank_counts_it_as_a_compile(server_env, tmp_path):
    err = open(tmp_path / "rank0.stderr", "w")
    server = forkserver.ForkServer(PROBE, server_env, ("tests.training.fork_preloaded", "tests.training.fork_jit"),
                                   [err.fileno()])
    env = {**server_env, "PROBE_RANK": "0", "PROBE_OUT": str(tmp_path / "rank0.json")}
    rank = server.start(PROBE, env, err.fileno())
    server.close()
    assert rank is not None, server.refusal
    assert rank.wait(timeout=60) == 0, (tmp_path / "rank0.stderr").read_text()
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["jit_started"], "the server compiled its starter function before forking"
    assert got["compiles_counted"] == 0, "the starter is not a project kernel: the rank counts no compile"


def test_a_rank_that_raises_exits_1_with_its_traceback_on_its_stderr(server_env, tmp_path):
    err = open(tmp_path / "rank0.stderr", "w")
    server = forkserver.ForkServer(PROBE, server_env, ("tests.training.fork_preloaded",), [err.fileno()])
    env = {**server_env, "PROBE_RANK": "0", "PROBE_OUT": str(tmp_path / "rank0.json"), "PROBE_EXIT": "raise"}
    rank = server.start(PROBE, env, err.fileno())
    server.close()
    assert rank is not None, server.refusal
    assert rank.wait(timeout=60) == 1
    err.close()
    text = (tmp_path / "rank0.stderr").read_text()
    assert "RuntimeError: the probe's own error" in text and "Traceback" in text, text


def test_a_server_whose_imports_fail_refuses_and_ranks_start_fresh(server_env, tmp_path):
    server = forkserver.ForkServer(PROBE, server_env, ("tests.training.no_such_module",), [])
    assert server.start(PROBE, {**server_env, "PROBE_RANK": "0", "PROBE_OUT": str(tmp_path / "r.json")}, 2) is None
    assert "no_such_module" in server.refusal
    assert server.proc is None, "the refusing server has exited"


def test_a_bad_fork_ranks_value_is_one_line_at_the_door(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), FORK_RANKS_ENV: "yes"}
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "training.run", str(script)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "ran" not in out.stdout
    assert out.stderr.strip().splitlines() == [
        "graphstore-run: error: GRAPHSTORE_FORK_RANKS='yes': set it to 1 (fork ranks and sampler processes from one "
        "server, the default) or 0 (start each as a fresh interpreter)"], out.stderr
