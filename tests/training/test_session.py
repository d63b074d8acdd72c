"""Your model, your loop: ``training.Session`` and ``graphstore-run``, through the examples as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.training.conftest import ROOT, run_launcher

EXAMPLES = ROOT / "examples"
EPOCH_LINE = re.compile(r"^epoch (\d+) loss ([0-9.]+) test_acc ([0-9.]+)$", re.M)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def graphstore_run(*args, cwd=ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_launcher([sys.executable, "-m", "training.run", *map(str, args)], _env(), cwd, timeout)


def epochs(out: str) -> list[tuple[int, float, float]]:
    return [(int(e), float(loss), float(acc)) for e, loss, acc in EPOCH_LINE.findall(out)]


def _left_running(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "pgrep" not in line]


@pytest.fixture(scope="module")
def links2(tmp_path_factory):
    """A synthetic graph in 2 partitions with a stored 0.8/0.1/0.1 link split."""
    import graphstore

    dest = tmp_path_factory.mktemp("links") / "links2"
    graphstore.ingest("synthetic:nodes=2000,avg_degree=8,features=16,classes=4,seed=0", dest, num_parts=2,
                      link_split=(0.8, 0.1, 0.1), seed=1)
    return dest


@pytest.fixture(scope="module")
def mag2(tmp_path_factory):
    import graphstore

    dest = tmp_path_factory.mktemp("mag") / "mag2"
    graphstore.ingest("synthetic-mag:papers=800,features=8,classes=4,seed=1", dest, num_parts=2)
    return dest


def test_the_node_example_trains_a_citation_graph_on_two_ranks(cora2):
    """A GraphConv of the script's own, its own loop and evaluation, through graphstore-run."""
    out = graphstore_run("--nproc", 2, EXAMPLES / "node_classification.py", cora2, "--epochs", 8, "--batch-size", 32)
    assert out.returncode == 0, out.stderr[-3000:]
    got = epochs(out.stdout)
    assert [e for e, _, _ in got] == list(range(1, 9)), out.stdout
    assert got[-1][2] >= 0.70, got  # Cora's public split; the built-in SAGE reaches 0.74-0.79 (test_ranks_per_partition)


def test_the_node_example_runs_unchanged_under_torchrun(synthetic2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(EXAMPLES / "node_classification.py"), str(synthetic2), "--epochs", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=_env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert epochs(out.stdout)[-1][2] >= 0.5, out.stdout


def test_the_link_example_trains_on_the_stored_split(links2):
    out = graphstore_run("--nproc", 2, EXAMPLES / "link_prediction.py", links2, "--epochs", 2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(epochs(out.stdout)) == 2 and epochs(out.stdout)[-1][2] > 0.55, out.stdout


def test_the_heterogeneous_example_trains_its_own_hetero_conv(mag2):
    out = graphstore_run("--nproc", 2, EXAMPLES / "heterogeneous.py", mag2, "--epochs", 2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(epochs(out.stdout)) == 2 and epochs(out.stdout)[-1][2] > 0.4, out.stdout


def test_a_script_that_raises_on_one_rank_ends_the_job_naming_it_once(synthetic2, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from training import Session

        with Session(sys.argv[1]) as s:
            for batch in s.loader([5, 5], input_nodes="train_mask", batch_size=64, shuffle=True):
                if s.rank == 1:
                    raise RuntimeError("boom")
                s.all_reduce(torch.zeros(1))
    """))
    started = time.monotonic()
    out = graphstore_run("--nproc", 2, "--timeout", 30, script, synthetic2, cwd=tmp_path, timeout=120)
    assert time.monotonic() - started < 60
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("boom") == 1 and "rank 1: boom" in out.stderr, out.stderr
    assert not _left_running(str(script)), "a rank outlived the job"


def test_a_rank_that_never_creates_the_loader_is_named(synthetic2, tmp_path):
    script = tmp_path / "forgot.py"
    script.write_text(textwrap.dedent("""
        import sys
        from training import Session

        with Session(sys.argv[1]) as s:
            if s.rank == 0:
                s.loader([5], input_nodes="train_mask", batch_size=64)
    """))
    started = time.monotonic()
    out = graphstore_run("--nproc", 2, "--timeout", 60, script, synthetic2, cwd=tmp_path, timeout=120)
    assert out.returncode != 0
    assert re.search("rank 1 at [^ ]+ [^ ]+ did not create loader 0 before it left the session", out.stderr), out.stderr
    assert time.monotonic() - started < 60, "named only when the timeout ended, not when rank 1 left"
    assert not _left_running(str(script))


def test_sigterm_then_resume_ends_with_the_loss_of_an_uninterrupted_run(synthetic2, tmp_path):
    """The example saves at the step SIGTERM is agreed on, exits 75, and --resume goes on at the next batch."""
    args = [EXAMPLES / "node_classification.py", synthetic2, "--epochs", 2, "--batch-size", 16]
    whole = graphstore_run("--nproc", 2, *args, cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    ckpt = tmp_path / "ck.pt"
    cmd = [sys.executable, "-m", "training.run", "--nproc", "2", *map(str, args), "--checkpoint", str(ckpt)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    first = job.stdout.readline()  # epoch 1's line: the ranks are in epoch 2 (25 steps each)
    assert first.startswith("epoch 1"), (first, job.stderr.read() if job.poll() is not None else "")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-3000:]
    resumed = graphstore_run("--nproc", 2, *args, "--checkpoint", ckpt, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert epochs(resumed.stdout)[-1] == epochs(whole.stdout)[-1], (resumed.stdout, whole.stdout)


def test_graphstore_train_trains_your_own_model(cora2, tmp_path):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import torch
        from torch_geometric.nn import GraphConv

        class Net(torch.nn.Module):
            def __init__(self, i, o, hidden):
                super().__init__()
                self.a, self.b = GraphConv(i, hidden), GraphConv(hidden, o)

            def forward(self, x, edge_index):
                return self.b(torch.relu(self.a(x, edge_index)), edge_index)

        def build(in_channels, out_channels, config):
            return Net(in_channels, out_channels, config.hidden)
    """))
    cmd = [sys.executable, "-m", "training.launch", str(cora2), "--no-progress", "--nproc", "2", "--epochs", "8",
           "--eval-every", "8", "--fanout", "10,5", "--batch-size", "32", "--model", "mymodels:build", "--metrics-out", "m.json"]
    out = run_launcher(cmd, _env(), tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads((tmp_path / "m.json").read_text())["epochs"][-1]
    assert last["test_acc"] >= 0.70, last


@pytest.mark.parametrize("spec, words", [
    ("nosuchmodule:build", "cannot import 'nosuchmodule'"),
    ("mymodels:missing", "'missing' is not defined there"),
])
def test_a_model_factory_that_cannot_be_imported_is_one_line_before_any_rank(synthetic2, tmp_path, spec, words):
    (tmp_path / "mymodels.py").write_text("def build(i, o, config):\n    return None\n")
    cmd = [sys.executable, "-m", "training.launch", str(synthetic2), "--model", spec]
    out = run_launcher(cmd, _env(), tmp_path, timeout=120)
    assert out.returncode == 2 and words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_one_session_on_its_own(synthetic2, tmp_path):
    """A script run with plain python is a job of one rank: its loader, refusals, checkpoints and loader
    positions, without a launcher."""
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch
        from graphstore.errors import GraphstoreError
        from training import Session

        said = {}
        def refused(key, call):
            try:
                call()
            except GraphstoreError as exc:
                said[key] = str(exc)

        with Session(sys.argv[1], seed=3) as s:
            said["who"] = [s.rank, s.world_size, str(s.device), s.num_features, s.num_classes]
            loader = s.loader([5, 5], input_nodes="train_mask", batch_size=100, shuffle=True)
            refused("workers", lambda: s.loader([5], input_nodes="train_mask", persistent_workers=True))
            refused("collate", lambda: s.loader([5], input_nodes="train_mask", collate_fn=list))
            refused("mask", lambda: s.loader([5], input_nodes="nope_mask"))
            refused("garbage", lambda: s.load(sys.argv[2]))
            ids = [[int(b.n_id[:b.batch_size].sum()) for b in loader] for _ in range(2)]
            it = iter(loader)
            head = [int(next(it).n_id[:100].sum()) for _ in range(3)]
            s.save({"step": 3}, sys.argv[3])
            tail = [int(b.n_id[:100].sum()) for b in it]
            again = s.load(sys.argv[3])
            resumed = [int(b.n_id[:100].sum()) for b in loader]
            said.update(len=len(loader), ids=ids, head=head, tail=tail, resumed=resumed, state=again)
        print(json.dumps(said))
    """))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    out = subprocess.run([sys.executable, str(script), str(synthetic2), str(garbage), str(tmp_path / "c.pt")],
                         capture_output=True, text=True, timeout=180, env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["who"] == [0, 1, "cpu", 4, 4]
    assert said["len"] == 8 and [len(p) for p in said["ids"]] == [8, 8]  # 800 training nodes, 100 a batch
    assert said["ids"][0] != said["ids"][1]  # a new order every pass
    assert "persistent_workers" in said["workers"] and "collate_fn" in said["collate"]
    assert "nope_mask" in said["mask"] and "train_mask" in said["mask"]
    assert "not a readable checkpoint" in said["garbage"]
    assert said["resumed"] == said["tail"] and len(said["tail"]) == 5  # went on at the batch after the third
    assert said["state"] == {"step": 3}
