"""One writer per DEST: the ingest claim, its refusals, dead claims cleared, and a commit that checks DEST first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import graphstore
from graphstore.dataset import layout
from graphstore.cli.app import main
from graphstore.errors import DatasetExistsError, IngestClaimedError
from graphstore.ingest import claim as claim_module
from graphstore.ingest import pipeline
from graphstore.ingest.claim import Holder, claimed, take_claim
from graphstore.storage.local import open_location

SPEC = "synthetic:nodes=2000,avg_degree=5,features=8,classes=4,seed=1"
ARGS = ["--parts", "1", "--method", "random"]

# `graphstore ingest` (cli.main) in a process of its own, gated: both racers wait right before taking the claim,
# are let go together, and hold what they got for a second, so the two ingests overlap for certain (started
# plainly, interpreter start-up jitter can exceed one whole ingest of this graph, and the second then meets a
# finished dataset instead of a claim)
RACER = textwrap.dedent("""
    import os, sys, time
    from graphstore.ingest import claim
    from graphstore.cli.app import main

    real, gate = claim.take_claim, sys.argv[1]

    def gated(location):
        open(f"{gate}.ready-{os.getpid()}", "w").close()
        while not os.path.exists(gate):
            time.sleep(0.005)
        taken = real(location)
        time.sleep(1.0)
        return taken

    claim.take_claim = gated
    sys.exit(main(sys.argv[2:]))
""")


def _claim_file(dest) -> str:
    return os.path.join(os.path.dirname(str(dest)), layout.ingest_claim(os.path.basename(str(dest))))


def _left_beside(dest) -> list[str]:
    return sorted(p for p in os.listdir(os.path.dirname(str(dest))) if p.startswith("."))


@pytest.mark.slow  # two interpreters start (seconds); the rest of this file runs in-process
def test_two_ingests_started_together_one_wins_the_other_is_named(tmp_path):
    dest, gate = tmp_path / "ds", tmp_path / "gate"
    from tests.conftest import started_together

    procs, out = started_together([[sys.executable, "-c", RACER, str(gate), "ingest", SPEC, str(dest), *ARGS]] * 2,
                                  gate, 2)
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, out)
    err = out[codes.index(2)][1].strip()
    winner = procs[codes.index(0)].pid
    assert len(err.splitlines()) == 1, err
    assert "is being written by another ingest" in err and f"pid {winner}" in err, err
    assert main(["verify", str(dest)]) == 0
    assert _left_beside(dest) == [], "a claim or a staging directory was left behind"


def _holder(**changes) -> bytes:
    doc = json.loads(Holder.here("/elsewhere").to_bytes())
    return json.dumps({**doc, **changes}).encode()


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


REFUSED = [  # (what the claim file holds, words of the one-line refusal)
    (lambda: _holder(), ["being written by another ingest", f"pid {os.getpid()}", "kill"]),
    (lambda: _holder(host="node-17", pid=1), ["host node-17, pid 1", "this host cannot tell", "delete the claim"]),
    (lambda: _holder(machine="another-boot/pid:[1]", pid=_exited_pid()), ["being written", "delete the claim"]),
    (lambda: b"", ["cannot read", "delete that file"]),
    (lambda: b"{not json", ["cannot read", "delete that file"]),
]


@pytest.mark.parametrize("content,words", REFUSED, ids=["live-here", "other-host", "other-boot", "empty", "garbage"])
def test_a_claim_that_may_be_live_is_refused_and_left_alone(tmp_path, capsys, content, words):
    dest = tmp_path / "ds"
    claim = _claim_file(dest)
    raw = content()
    with open(claim, "wb") as fh:
        fh.write(raw)
    assert main(["ingest", SPEC, str(dest), *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"DEST {dest}" in err, err
    for word in words:
        assert word in err, err
    if "delete" in err:
        assert claim in err, "the refusal names the file to delete"
    assert not dest.exists() and open(claim, "rb").read() == raw, "the other ingest's claim was touched"
    assert _left_beside(dest) == [os.path.basename(claim)]


@pytest.mark.parametrize("how", ["exited", "pid-reused"])
def test_a_dead_ingests_claim_on_this_machine_is_cleared(tmp_path, caplog, how):
    dest = tmp_path / "ds"
    pid = _exited_pid() if how == "exited" else os.getpid()  # reused: this pid, but not the start time it had
    with open(_claim_file(dest), "wb") as fh:
        fh.write(_holder(pid=pid) if how == "exited" else _holder(pid=pid, pid_start="1"))
    with caplog.at_level("WARNING", logger="graphstore.ingest.claim"):
        graphstore.ingest(SPEC, dest, method="random")
    assert "clearing the claim" in caplog.text and f"pid {pid}" in caplog.text
    assert graphstore.open_dataset(dest).num_nodes() == 2000
    assert _left_beside(dest) == []


def test_only_one_of_two_takers_of_a_dead_claim_wins(tmp_path):
    dest = tmp_path / "ds"
    stale = _holder(pid=_exited_pid())
    with open(_claim_file(dest), "wb") as fh:
        fh.write(stale)
    first = take_claim(open_location(dest))
    with pytest.raises(IngestClaimedError, match=f"pid {os.getpid()}"):  # the first taker is alive: refused
        take_claim(open_location(dest))
    slot = open_location(dest).claim_slot()
    slot.set_aside(stale)  # a second taker, late: it read the dead claim, but the claim is the first taker's now
    first.check()  # put back: still the first taker's
    first.release()
    assert _left_beside(dest) == []


class Stop(BaseException):
    pass


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt(), Stop()])
def test_the_claim_is_released_however_the_ingest_ends(tmp_path, monkeypatch, error):
    def fail(*args, **kwargs):
        assert os.path.exists(_claim_file(tmp_path / "ds")), "the claim is held while the dataset is written"
        raise error

    monkeypatch.setattr(pipeline, "_write_dataset", fail)
    with pytest.raises(type(error)):
        graphstore.ingest(SPEC, tmp_path / "ds")
    assert _left_beside(tmp_path / "ds") == [] and not (tmp_path / "ds").exists()


@pytest.fixture(scope="module")
def other_dataset(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("other") / "ds"
    graphstore.ingest("synthetic:nodes=300,avg_degree=3,seed=9", path, method="random")
    return str(path)


def _copy_in(other: str, dest) -> None:
    """A writer that does not take the claim puts a dataset at DEST (replacing what is there)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(other, dest)


def _steal(dest) -> None:
    with open(_claim_file(dest), "wb") as fh:
        fh.write(_holder(host="thief"))


CHANGED = [  # (DEST before: None or a dataset, what happens meanwhile, error, words)
    (False, _copy_in, DatasetExistsError, ["held nothing, now a dataset", "nothing was committed"]),
    (True, _copy_in, DatasetExistsError, ["held a dataset, now a different dataset"]),
    (True, lambda other, dest: shutil.rmtree(dest), DatasetExistsError, ["held a dataset, now nothing"]),
    (False, lambda other, dest: _steal(dest), IngestClaimedError, ["now held by host thief", "nothing was committed"]),
    (False, lambda other, dest: os.remove(_claim_file(dest)), IngestClaimedError, ["was removed"]),
]


@pytest.mark.parametrize("existing,change,error,words", CHANGED,
                         ids=["new-became-dataset", "dataset-replaced", "dataset-removed", "claim-stolen",
                              "claim-removed"])
def test_the_commit_refuses_when_dest_changed_underneath(tmp_path, monkeypatch, other_dataset, existing, change,
                                                         error, words):
    dest = tmp_path / "ds"
    if existing:
        graphstore.ingest("synthetic:nodes=500,avg_degree=3,seed=4", dest, method="random")
    real = pipeline._write_dataset

    def meanwhile(*args, **kwargs):
        summary = real(*args, **kwargs)
        change(other_dataset, dest)
        return summary

    monkeypatch.setattr(pipeline, "_write_dataset", meanwhile)
    with pytest.raises(error) as info:
        graphstore.ingest(SPEC, dest, method="random", overwrite=existing)
    for word in words:
        assert word in str(info.value), str(info.value)
    if dest.exists():  # what the other writer left is left as it is; this ingest's dataset is not there
        assert graphstore.open_dataset(dest).num_nodes() in (300, 500)
    assert not [p for p in _left_beside(dest) if ".partial-" in p or ".old-" in p]


def test_a_dest_that_became_a_dataset_before_the_claim_is_not_replaced(tmp_path, monkeypatch, other_dataset):
    """Checked, then another ingest committed, then this one claimed: the claim's first look sees it."""
    dest = tmp_path / "ds"
    real = claim_module.take_claim

    def late(location):
        _copy_in(other_dataset, dest)
        return real(location)

    monkeypatch.setattr(claim_module, "take_claim", late)
    with pytest.raises(DatasetExistsError, match="held nothing, now a dataset"):
        graphstore.ingest(SPEC, dest, method="random")
    assert graphstore.open_dataset(dest).num_nodes() == 300 and _left_beside(dest) == []


def test_claimed_context_on_a_location_without_a_slot_warns(caplog):
    class Bare:
        url = "bare://x"

    with caplog.at_level("WARNING", logger="graphstore.ingest.claim"), claimed(Bare()) as claim:
        assert claim is None
    assert "not detected" in caplog.text


@pytest.mark.s3
def test_s3_second_claim_is_refused_and_the_first_commits(s3):
    url = s3.url("ds")
    location = open_location(url, s3.storage_options)
    first = take_claim(location)
    key = f"{s3.bucket}/{layout.ingest_claim('ds')}"
    assert Holder.parse(s3.fs().cat(key)).token == first.holder.token
    with pytest.raises(IngestClaimedError, match=rf"DEST s3://{s3.bucket}/ds is being written .*pid {os.getpid()}"):
        graphstore.ingest(SPEC, url, storage_options=s3.storage_options, method="random")
    assert not s3.fs().exists(f"{s3.bucket}/ds")
    first.release()
    assert not s3.fs().exists(key)
    graphstore.ingest(SPEC, url, storage_options=s3.storage_options, method="random")
    assert graphstore.open_dataset(url, s3.storage_options).num_nodes() == 2000 and not s3.fs().exists(key)


@pytest.mark.s3
def test_s3_claim_from_another_host_is_named_and_a_lost_claim_never_commits(s3, monkeypatch):
    url, key = s3.url("ds"), f"{s3.bucket}/{layout.ingest_claim('ds')}"
    s3.fs().pipe(key, _holder(host="node-3"))
    with pytest.raises(IngestClaimedError, match=f"host node-3.*delete the claim s3://{key}"):
        graphstore.ingest(SPEC, url, storage_options=s3.storage_options)
    s3.fs().rm(key)
    real = pipeline._write_dataset

    def steal_then_write(*args, **kwargs):
        s3.fs().pipe(key, _holder(host="thief"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_write_dataset", steal_then_write)
    with pytest.raises(IngestClaimedError, match="now held by host thief"):
        graphstore.ingest(SPEC, url, storage_options=s3.storage_options)
    assert not s3.fs().exists(f"{s3.bucket}/ds/zarr.json")


SLOW_WRITER = textwrap.dedent("""
    import os, sys, time
    from graphstore.ingest import pipeline
    from graphstore.cli.app import main

    def stuck(source, staged, *args, **kwargs):
        os.makedirs(staged.root)  # as the writer does first
        open(sys.argv[1], "w").close()
        time.sleep(120)

    pipeline._write_dataset = stuck
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.slow  # one interpreter starts
def test_a_terminated_ingest_removes_its_claim_and_staging(tmp_path):
    dest, writing = tmp_path / "ds", tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(writing), "ingest", SPEC, str(dest), *ARGS],
                            stderr=subprocess.PIPE, text=True)
    try:
        while not writing.exists() and proc.poll() is None:
            time.sleep(0.01)
        assert os.path.exists(_claim_file(dest)) and any(".partial-" in p for p in _left_beside(dest))
        proc.terminate()
        err = proc.communicate(timeout=60)[1].strip()
    finally:
        proc.kill()
    assert proc.returncode == 75 and err == ("graphstore ingest: terminated (SIGTERM); nothing was committed, and a "
                                             "rerun starts afresh"), err
    assert _left_beside(dest) == [] and not dest.exists()
