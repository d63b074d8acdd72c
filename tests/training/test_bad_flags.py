"""graphstore-train on bad flags and damaged data, one row each: exit code, one line naming it, nothing left.

``FLAG_CASES`` rows are (arguments after the dataset, exit code, a word the line must contain); they run
in-process (the checks all happen before any rank starts). ``{t}`` is the row's own empty directory,
which must still be empty afterwards. The rows of ``JOB_CASES`` need real ranks and run as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import graphstore
from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable
from tests.training.conftest import ROOT, train_cmd
from training.launch import main

SPEC = "synthetic:nodes=1500,avg_degree=5,features=8,classes=3,seed=4"

FLAG_CASES = [
    (["--dropout", "2"], 2, "--dropout"),
    (["--dropout", "nan"], 2, "--dropout"),
    (["--lr", "-1"], 2, "--lr"),
    (["--lr", "0"], 2, "--lr"),
    (["--lr", "inf"], 2, "--lr"),
    (["--nproc", "0"], 2, "--nproc"),
    (["--nproc", "-3"], 2, "--nproc"),
    (["--epochs", "0"], 2, "--epochs"),
    (["--batch-size", "0"], 2, "--batch-size"),
    (["--timeout", "nan"], 2, "--timeout"),
    (["--cache-rows", "-1"], 2, "--cache-rows"),
    (["--seed", "-1"], 2, "--seed"),
    (["--fanout", "5,x"], 2, "--fanout"),
    (["--fanout", "0,5"], 2, "--fanout"),
    (["--device", "cuda"] if not __import__("torch").cuda.is_available() else ["--device", "tpu"], 2, "--device"),
    (["--checkpoint-dir", "{t}/file"], 2, "is a file"),
    (["--checkpoint-dir", "{t}/file/sub"], 2, "is a file"),
    (["--metrics-out", "{t}/missing/m.json"], 2, "does not exist"),
    (["--metrics-out", "{t}"], 2, "is a directory"),
    (["--resume"], 2, "--checkpoint-dir"),
    (["--task", "link", "--edge-type", "x,y,z"], 2, "edge type"),
    (["--target", "nope"], 2, "--target"),
    (["--task", "link", "--target", "nope"], 2, "--target"),
    (["--edge-type", "a,b,c"], 2, "--edge-type"),
    (["--eval-every", "0"], 2, "--eval-every"),
    (["--eval-every", "-2"], 2, "--eval-every"),
    (["--eval-every", "1.5"], 2, "--eval-every"),
    (["--eval-max-batches", "-1"], 2, "--eval-max-batches"),
    (["--eval-max-batches", "all"], 2, "--eval-max-batches"),
    (["--threads", "0"], 2, "--threads"),
    (["--loader-only", "--infer-out", "h"], 2, "--loader-only"),
    (["--loader-only", "--checkpoint-dir", "{t}/ck"], 2, "--loader-only"),
    (["--cache-max-bytes", "garbage"], 2, "--cache-max-bytes"),
    (["--cache-max-bytes", "0"], 2, "--cache-max-bytes"),
    (["--cache-max-bytes", "1GB"], 2, "--cache-max-bytes does nothing for the local dataset"),
    (["--cache-dir", "{t}/cache"], 2, "--cache-dir does nothing for the local dataset"),
    (["--time-attr", "nosuch"], 2, "--time-attr 'nosuch' is no node or edge attribute"),
    (["--time-attr", "x"], 2, "float32[8]"),
    (["--time-attr", "train_mask"], 2, "--time-attr 'train_mask' is bool"),
    (["--interface", "nosuch0"], 2, "--interface 'nosuch0' is not an interface"),
    (["--checkpoint-dir", "/proc/graphstore-ckpt"], 2, "--checkpoint-dir /proc/graphstore-ckpt"),
    (["--checkpoint-dir", "/proc/graphstore-ckpt/sub"], 2, "--checkpoint-dir /proc/graphstore-ckpt/sub"),
    (["--metrics-out", "/proc/graphstore-m.json"], 2, "--metrics-out /proc/graphstore-m.json"),
    (["--infer-out", "h", "--task", "link"], 2, "--infer-out"),
    (["--infer-out", "h", "--model", "gcn"], 2, "--infer-out with --model gcn"),
    (["--infer-out", "x"], 2, "already has node attribute 'x', written by ingest"),
    (["--infer-out", "orig_id"], 2, "reserved"),
    (["--infer-out", "a/b"], 2, "--infer-out 'a/b'"),
    (["--neg-sampling", "triplet"], 2, "--neg-sampling"),
    (["--task", "link", "--edge-type", "rel"], 2, "--edge-type rel"),
    (["--checkpoint-dir", "{t}/ck", "--infer-out", "x"], 2, "--infer-out"),  # the tried directory is gone again
    (["--servers", "nohost"], 2, "--servers 'nohost': give HOST:PORT"),
    (["--servers", "h:0"], 2, "give HOST:PORT"),
    (["--servers", "h:1", "--loader-workers", "2"], 2, "graphstore serve --loader-workers"),
    (["--servers", "h:1", "--unmapped"], 2, "--unmapped with --servers"),
    (["--servers", "h:1", "--gpu-cache", "1GB"], 2, "--gpu-cache with --servers"),
    (["--servers", "h:1", "--infer-out", "h"], 2, "--infer-out with --servers"),
    (["--servers", "h:1", "--feature-cache", "1GB"], 2, "--feature-cache with --servers"),
]

# flags the door must let through (ranks start; here a stub): what was tried is removed, nothing is left in {t}
GOOD_CASES = [
    ["--checkpoint-dir", "{t}/a/b"],
    ["--resume", "--checkpoint-dir", "{t}/ck"],
    ["--metrics-out", "{t}/m.json"],
    ["--interface", "lo"],
    ["--infer-out", "emb"],
    ["--infer-out", "emb", "--model", "gin"],
    ["--task", "link", "--neg-sampling", "triplet"],
    ["--loader-only", "--model", "gcn"],
    ["--loader-workers", "2", "--feature-cache", "off"],
    ["--loader-workers", "2", "--feature-cache", "64MB"],
    ["--loader-workers", "2", "--unmapped"],
    ["--loader-workers", "2", "--gpu-cache", "1GB"],
    ["--servers", "h:1", "--task", "link", "--neg-sampling", "triplet"],
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    dest = tmp_path_factory.mktemp("train") / "ds"
    graphstore.ingest(SPEC, dest, num_parts=2)
    return str(dest)


@pytest.mark.parametrize("args,code,word", FLAG_CASES, ids=[" ".join(c[0]) for c in FLAG_CASES])
def test_bad_flags_refused_before_ranks_start(ds, tmp_path, capsys, monkeypatch, args, code, word):
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    prepared = set()
    if any("{t}/file" in a for a in args):
        (tmp_path / "file").write_text("mine")
        prepared.add("file")
    argv = [ds, "--no-progress", *(a.format(t=tmp_path) for a in args)]
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1, err
    assert set(os.listdir(tmp_path)) == prepared, "something was written"
    if prepared:
        assert (tmp_path / "file").read_text() == "mine"


def _no_ranks(*args, **kwargs):
    raise AssertionError("ranks were started: the check must come before")


def _refused(argv, capsys, monkeypatch, code=2) -> str:
    """Run ``main(argv)`` with ranks forbidden; the one line it printed."""
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _accepted(argv, capsys, monkeypatch) -> None:
    """``main(argv)`` gets as far as starting the ranks (stubbed), printing nothing."""
    started = []
    monkeypatch.setattr("training.launch.launch_local", lambda config, nproc, grace: started.append(nproc) or 0)
    assert main(argv) == 0, capsys.readouterr().err
    assert started and capsys.readouterr().err == ""


@pytest.mark.parametrize("args", GOOD_CASES, ids=[" ".join(c) for c in GOOD_CASES])
def test_good_flags_pass_the_door_and_leave_nothing(ds, tmp_path, capsys, monkeypatch, args):
    _accepted([ds, "--no-progress", *(a.format(t=tmp_path) for a in args)], capsys, monkeypatch)
    assert os.listdir(tmp_path) == [], "a directory tried at the door was left behind"


@pytest.fixture(scope="module")
def others(ds, tmp_path_factory) -> dict[str, str]:
    """Datasets the synthetic one cannot stand for: times of several dtypes, heterogeneous, an earlier output."""
    from graphstore.outputs.writer import OutputWriter

    root, rng, n = tmp_path_factory.mktemp("others"), np.random.default_rng(0), 60
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    labelled = {"x": ArrayRows(rng.random((n, 4), dtype=np.float32)), "y": ArrayRows(rng.integers(0, 3, n)),
                "train_mask": ArrayRows(rng.random(n) < 0.5), "ntime": ArrayRows(rng.integers(0, 99, n))}
    timed = {None: NodeTable(n, {**labelled, "ftime": ArrayRows(rng.random(n, dtype=np.float32))})}
    graphstore.ingest(GraphSource(timed, {None: EdgeTable(src, dst, {"etime": ArrayRows(rng.integers(0, 99, 300))})}),
                      root / "time", num_parts=2)
    nodes = {"a": NodeTable(n, labelled), "b": NodeTable(n, {"x": ArrayRows(rng.random((n, 4), dtype=np.float32))})}
    edges = {("a", "to", "b"): EdgeTable(src, dst), ("b", "rev", "a"): EdgeTable(dst, src),
             ("a", "self", "a"): EdgeTable(src, dst)}
    graphstore.ingest(GraphSource(nodes, edges), root / "hetero", num_parts=2)
    shutil.copytree(ds, root / "output")
    writer = OutputWriter(str(root / "output"), "emb", row_shape=(2,))
    offsets = writer.manifest.node_types[0].offsets
    writer.commit({p: writer.write_part(p, np.zeros((offsets[p + 1] - offsets[p], 2))) for p in range(2)})
    return {name: str(root / name) for name in ("time", "hetero", "output")}


# (dataset of ``others``, flags, a word of the one line; None: accepted, the ranks would start)
OTHER_CASES = [
    ("time", ["--time-attr", "etime"], "no node attribute of the nodes"),
    ("time", ["--time-attr", "ftime"], "--time-attr 'ftime' is float32"),
    ("time", ["--time-attr", "ntime"], None),
    ("time", ["--task", "link", "--time-attr", "etime"], None),
    ("time", ["--task", "link", "--time-attr", "ntime"], "no attribute of the edges"),  # PyG: negatives need it
    ("hetero", ["--model", "gcn"], "--model gcn cannot train"),
    ("hetero", ["--model", "gat", "--task", "link", "--edge-type", "to"], "--model gat cannot train"),
    ("hetero", ["--model", "gcn", "--loader-only"], None),
    ("hetero", ["--model", "gin"], None),
    ("hetero", ["--infer-out", "h"], "--infer-out writes outputs of homogeneous node classification only"),
    ("hetero", ["--task", "link", "--edge-type", "to", "--time-attr", "ntime"], "no attribute of edge type"),
    ("hetero", ["--task", "link", "--edge-type", "nope"], "--edge-type nope: edge type"),
    ("output", ["--infer-out", "emb"], "already has output 'emb'"),
    ("output", ["--infer-out", "emb2"], None),
]


@pytest.mark.parametrize("name,args,word", OTHER_CASES, ids=[f"{c[0]}: {' '.join(c[1])}" for c in OTHER_CASES])
def test_flags_that_depend_on_the_dataset(others, capsys, monkeypatch, name, args, word):
    argv = [others[name], "--no-progress", *args]
    if word is None:
        _accepted(argv, capsys, monkeypatch)
    else:
        assert word in _refused(argv, capsys, monkeypatch)


@pytest.mark.parametrize("pointer,word", [("{", "is unreadable"), ('{"file": "checkpoint-epoch0001.pt"}', "names")])
def test_resume_from_a_broken_pointer_is_refused(ds, tmp_path, capsys, monkeypatch, pointer, word):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest.json").write_text(pointer)
    err = _refused([ds, "--resume", "--checkpoint-dir", str(tmp_path / "ck")], capsys, monkeypatch)
    assert err.startswith("graphstore-train: error: --resume") and word in err, err


def test_cache_directory_of_a_remote_dataset_is_tried(tmp_path, capsys, monkeypatch):
    from graphstore.storage.local import open_location

    url = f"memory://graphstore-door-{tmp_path.name}/ds"
    graphstore.ingest("synthetic:nodes=200,avg_degree=3,features=4,classes=2,seed=1", url, num_parts=2)
    try:
        err = _refused([url, "--cache-dir", "/proc/graphstore-cache"], capsys, monkeypatch)
        assert "--cache-dir /proc/graphstore-cache" in err, err
        _accepted([url, "--cache-dir", str(tmp_path / "c"), "--cache-max-bytes", "1GB"], capsys, monkeypatch)
        assert os.listdir(tmp_path) == []
    finally:
        open_location(url).remove()


def test_a_bad_cache_size_in_the_environment_is_named(ds, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHSTORE_CACHE_MAX_BYTES", "lots")
    assert "$GRAPHSTORE_CACHE_MAX_BYTES 'lots' is not a size" in _refused([ds], capsys, monkeypatch)


def test_link_task_on_an_edge_type_without_edges(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    nodes = {"a": NodeTable(4, {}), "b": NodeTable(3, {})}
    edges = {("a", "to", "a"): EdgeTable(np.array([0, 1, 2]), np.array([1, 2, 3])),
             ("a", "to", "b"): EdgeTable(np.zeros(0, np.int64), np.zeros(0, np.int64))}
    graphstore.ingest(GraphSource(nodes, edges), tmp_path / "h")
    assert main([str(tmp_path / "h"), "--task", "link", "--edge-type", "a,to,b"]) == 2
    err = capsys.readouterr().err
    assert "has no edges" in err and "('a', 'to', 'a')" in err, err


def test_missing_chunk_found_before_ranks_start(ds, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    os.remove(copy / "part_00001" / "nodes" / "_N" / "x" / "c" / "0" / "0")
    assert main([str(copy), "--no-progress"]) == 2
    assert "chunk 0 of part_00001/nodes/_N/x is missing" in capsys.readouterr().err


def _flip(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[64] ^= 0xFF
    path.write_bytes(raw)


# (damaged chunk, extra flags, words of the one line): real ranks, exit 2, traceback kept in the log
JOB_CASES = [
    ("part_00001/edges/_N/indices/c/0", [], ["rank 1:", "part_00001/edges/_N/indices", "fails its checksum"]),
    ("part_00001/nodes/_N/x/c/0/0", ["--verify-reads"], ["rank 1:", "part_00001/nodes/_N/x", "fails its checksum"]),
]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("chunk,flags,words", JOB_CASES, ids=[c[0].split("/")[3] for c in JOB_CASES])
def test_damaged_data_stops_the_job_in_one_line(ds, tmp_path, chunk, flags, words):
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    _flip(copy / chunk)
    (tmp_path / "sys").mkdir()
    (tmp_path / "logs").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "sys"),
           "GRAPHSTORE_LOG_DIR": str(tmp_path / "logs")}
    out = subprocess.run(train_cmd(copy, "--epochs", 1, "--fanout", "5,5", *flags), capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert all(w in lines[0] for w in words), lines[0]
    logs = os.listdir(tmp_path / "logs")
    assert len(logs) == 1 and logs[0] in lines[0]
    assert "Traceback" in (tmp_path / "logs" / logs[0]).read_text()
    assert os.listdir(tmp_path / "sys") == [], "the job left temporary files behind"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_run_leaves_no_temporary_files(ds, tmp_path):
    """PyG writes a generated module per process into the temp directory; the launcher's goes with it."""
    (tmp_path / "sys").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "sys")}
    out = subprocess.run(train_cmd(ds, "--epochs", 1, "--fanout", "5,5"), capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert os.listdir(tmp_path / "sys") == [], "the run left temporary files behind"


# the launcher's one line from what the ranks recorded: (records, exit codes, stopped ranks, words, exit code)
SUMMARY_CASES = [
    ([dict(rank=1, time=2.0, message="rank 1: peer gone", echo=True, input=False),
      dict(rank=0, time=1.0, message="x chunk 3 fails its checksum", echo=False, input=True)],
     {0: 2, 1: 1}, set(), ["error: rank 0: x chunk 3 fails its checksum"], 2),
    ([dict(rank=0, time=1.0, message="rank 0: rank(s) [1] died", echo=True, input=False)],
     {0: 1, 1: -9}, set(), ["rank 1 exited with signal SIGKILL; rank 0: rank 0: rank(s) [1] died"], 1),
    ([dict(rank=0, time=1.0, message="boom", echo=False, input=False)],
     {0: 1, 1: -9}, {1}, ["rank 0: boom"], 1),
    ([], {0: 0, 1: 3}, set(), ["rank 1 exited with exit code 3"], 1),
]


@pytest.mark.parametrize("records,codes,stopped,words,code", SUMMARY_CASES)
def test_one_line_names_the_first_cause(tmp_path, monkeypatch, records, codes, stopped, words, code):
    import json

    from training.launcher import failures

    job = tmp_path / "job"
    job.mkdir()
    for r in records:
        (job / f"rank{r['rank']}.error.json").write_text(json.dumps({**r, "traceback": "Traceback: here\n"}))
    monkeypatch.setenv(failures.LOG_DIR_ENV, str(tmp_path))
    line, got = failures.summarize(str(job), codes, stopped)
    assert got == code and all(w in line for w in words) and "\n" not in line, line
    log = line.rsplit("rank output: ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(tmp_path) and ("Traceback" in open(log).read() or not records)


def test_a_log_directory_that_cannot_be_written_falls_back_and_keeps_the_ranks_error(tmp_path, monkeypatch):
    import json

    from training.launcher import failures

    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.error.json").write_text(json.dumps(dict(rank=0, time=1.0, message="x chunk 3 fails its checksum",
                                                          echo=False, input=True, traceback="Traceback: here\n")))
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv(failures.LOG_DIR_ENV, str(tmp_path / "file"))
    line, code = failures.summarize(str(job), {0: 2, 1: 1}, set())
    assert code == 2 and "\n" not in line and "rank 0: x chunk 3 fails its checksum" in line, line
    assert f"GRAPHSTORE_LOG_DIR={tmp_path / 'file'} cannot be written (Not a directory), so it went to the temp " \
           "dir" in line, line
    log = line.split("rank output: ", 1)[1].split(";", 1)[0]
    assert os.path.dirname(log) == str(tmp_path) and "Traceback" in open(log).read()


# the environment graphstore-train reads (torchrun's, SLURM's, its own launcher's): a bad value is one line
ENV_CASES = [
    ({"RANK": "abc", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK='abc' is not an integer >= 0"),
    ({"RANK": "0", "WORLD_SIZE": "abc", "MASTER_PORT": "29500"}, "WORLD_SIZE='abc' is not an integer >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer in [1, 65535]"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc' is not an integer >= 1"),
    ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node1"}, "SLURM_PROCID='abc'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "j1"},
     "SLURM_JOB_ID='j1'"),
    ({"GRAPHSTORE_INIT_METHOD": "file:///tmp/x"}, "GRAPHSTORE_INIT_METHOD is set but GRAPHSTORE_RANK and "
                                                  "GRAPHSTORE_WORLD_SIZE are not"),
    ({"GRAPHSTORE_INIT_METHOD": "file:///tmp/x", "GRAPHSTORE_RANK": "0", "GRAPHSTORE_WORLD_SIZE": "two"},
     "GRAPHSTORE_WORLD_SIZE='two'"),
]
_WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "SLURM_PROCID",
              "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "GRAPHSTORE_INIT_METHOD", "GRAPHSTORE_RANK",
              "GRAPHSTORE_WORLD_SIZE")


@pytest.mark.parametrize("env,word", ENV_CASES, ids=[" ".join(f"{k}={v}" for k, v in c[0].items()) for c in ENV_CASES])
def test_a_bad_environment_variable_is_one_line_before_ranks_start(ds, capsys, monkeypatch, env, word):
    for name in _WORLD_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = _refused([ds, "--no-progress"], capsys, monkeypatch)
    assert word in err and "Traceback" not in err, err


@pytest.mark.parametrize("env, word", [({"GRAPHSTORE_MALLOC": "tcmalloc"}, "GRAPHSTORE_MALLOC='tcmalloc'"),
                                       ({"GRAPHSTORE_JEMALLOC": "/nonexistent.so"}, "GRAPHSTORE_JEMALLOC"),
                                       ({"GRAPHSTORE_JEMALLOC": "/etc/passwd"},
                                        "GRAPHSTORE_JEMALLOC='/etc/passwd' is not an ELF shared library")])
def test_a_bad_allocator_setting_is_refused_before_ranks_start(ds, capsys, monkeypatch, env, word):
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    for name in ("LD_PRELOAD", "GRAPHSTORE_MALLOC", "GRAPHSTORE_JEMALLOC"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([ds, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1, err
