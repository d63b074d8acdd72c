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


LAUNCHER = """
import json, logging, os, sys
import numpy, tests.training.fork_preloaded
logging.basicConfig(level=logging.INFO, format="%%(message)s")
from training.launcher import forkserver
out, err_path, env_extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
err = open(err_path, "w")
env = {**os.environ, **env_extra}
os.environ.update({k: v for k, v in env_extra.items() if k.startswith("GRAPHSTORE_")})  # the launcher's own
import tempfile
job = tempfile.TemporaryDirectory()  # a finalizer of the launcher's: its folder outlives the rank's exit
reason = forkserver.forks_here(("numpy", "tests.training.fork_preloaded"), env)
server = forkserver.ForkServer(%r, env, ("numpy", "tests.training.fork_preloaded"), [err.fileno()])
rank = server.start(%r, env, err.fileno())
server_pid = server.proc.pid
server.close()
code = rank.wait(timeout=60) if rank is not None else None
json.dump({"forked": server.forked, "reason": reason, "code": code, "launcher": os.getpid(), "server": server_pid,
           "refusal": server.refusal, "job_folder_kept": os.path.isdir(job.name)}, open(out, "w"))
""" % (PROBE, PROBE)


def _launch_from_warm_process(tmp_path, env: dict, extra: dict) -> tuple[dict, dict]:
    extra = {"PROBE_RANK": "0", "PROBE_OUT": str(tmp_path / "rank0.json"), **extra}
    done = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path / "launcher.json"), str(tmp_path / "err"),
                           json.dumps(extra)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (tmp_path / "launcher.stderr").write_text(done.stderr)
    return (json.loads((tmp_path / "launcher.json").read_text()),
            json.loads((tmp_path / "rank0.json").read_text()))


def test_a_launcher_that_imported_the_ranks_modules_forks_its_server_from_itself(server_env, tmp_path):
    launcher, rank = _launch_from_warm_process(tmp_path, server_env, {"GRAPHSTORE_FORK_FROM_LAUNCHER": "1"})
    assert launcher["forked"] and launcher["reason"] is None and launcher["code"] == 0, launcher
    assert "the rank server is this process, forked" in (tmp_path / "launcher.stderr").read_text()
    assert launcher["job_folder_kept"], "the launcher's finalizers ran in the rank"
    assert rank["imported_by"] == launcher["launcher"], "imported once, by the launcher, before it forked"
    assert rank["ppid"] == launcher["launcher"] and rank["sid"] == rank["pid"]
    assert rank["argv"] == PROBE[2:] and not rank["server_env"]


def test_a_launcher_not_asked_to_fork_its_server_starts_it(server_env, tmp_path):
    launcher, rank = _launch_from_warm_process(tmp_path, server_env, {})
    assert not launcher["forked"] and launcher["reason"] == "GRAPHSTORE_FORK_FROM_LAUNCHER is not 1", launcher
    assert rank["imported_by"] == launcher["server"] != launcher["launcher"] and launcher["job_folder_kept"]


def test_a_launcher_started_under_another_allocator_than_its_ranks_starts_its_server(server_env, tmp_path):
    launcher, rank = _launch_from_warm_process(tmp_path, server_env, {"MALLOC_CONF": "narenas:1",
                                                                     "GRAPHSTORE_FORK_FROM_LAUNCHER": "1"})
    assert not launcher["forked"] and launcher["code"] == 0, launcher
    assert launcher["reason"] == "it started with MALLOC_CONF=None, the ranks get 'narenas:1'", launcher
    said = (tmp_path / "launcher.stderr").read_text()  # asked for and not done: its log says why
    assert f"GRAPHSTORE_FORK_FROM_LAUNCHER=1, but the rank server is started: {launcher['reason']}" in said, said
    assert rank["imported_by"] == launcher["server"] != launcher["launcher"], "the started server imported it"


def test_what_keeps_a_process_from_forking_the_rank_server_is_named(monkeypatch):
    import threading

    monkeypatch.setenv("GRAPHSTORE_FORK_FROM_LAUNCHER", "1")
    assert forkserver.forks_here(("tests.training.no_such_module",), dict(os.environ)) == (
        "it has not imported tests.training.no_such_module")
    assert forkserver.forks_here((), dict(os.environ)) == "it has not imported the ranks' modules"
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        assert "other thread(s)" in forkserver.forks_here(("os",), dict(os.environ))
    finally:
        stop.set()
        extra.join()


def test_the_tests_jobs_fork_their_rank_server_from_a_process_that_imported_the_ranks_modules(synthetic1):
    """run_train's launchers come from tests/training/zygote.py: their rank server is forked, not started (the
    suite's jobs would otherwise each import torch and PyG again); the ranks are what they always are."""
    from tests.training.conftest import ZYGOTE_ENV, run_train

    if os.environ.get(ZYGOTE_ENV, "1") == "0":
        pytest.skip(f"{ZYGOTE_ENV}=0: this run starts each launcher fresh")
    done = run_train(synthetic1, "-v", "--nproc", 2, "--epochs", 1, "--batch-size", 256, "--fanout", "3,3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the rank server is this process, forked: it has imported torch, torch_geometric" in done.stderr
    assert done.stdout.count("epoch 1/1") == 1, done.stdout


def test_a_bad_fork_from_launcher_value_is_one_line_at_the_door(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRAPHSTORE_FORK_FROM_LAUNCHER": "yes"}
    out = subprocess.run([sys.executable, "-m", "training.launch", str(tmp_path / "none")], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert "GRAPHSTORE_FORK_FROM_LAUNCHER='yes': set it to 1 " in out.stderr and len(out.stderr.splitlines()) == 1, (
        out.stderr)
