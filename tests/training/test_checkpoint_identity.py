"""A checkpoint belongs to its job: what --resume refuses at the door, what it applies and says once, what is
no checkpoint of ours, one job per directory, and writes that fail whole. One row each, a one-line message."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

import graphstore
from graphstore.errors import GraphstoreError, StorageError
from graphstore.ingest.claim import Holder
from tests.graphstore.test_bad_input_table import STORED_CASES, damage_stored
from training.loop import checkpoint, resume
from training.launcher import checks
from training.loop.checkpoint import CheckpointDirClaimedError, CheckpointMismatchError, NotACheckpointError
from training.config import TrainConfig
from training.launch import main

SPEC = "synthetic:nodes=400,avg_degree=4,features=8,classes=3,seed={seed}"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, graphstore.Dataset]:
    """Two datasets of one shape and schema, different data."""
    out = {}
    for key, seed in (("ds", 1), ("twin", 2)):
        dest = tmp_path_factory.mktemp(key) / key
        graphstore.ingest(SPEC.format(seed=seed), dest, num_parts=2)
        out[key] = graphstore.open_dataset(dest)
    return out


def _config(ds, ck, **changes) -> TrainConfig:
    return TrainConfig(dataset=ds.url, checkpoint_dir=str(ck), resume=True, **changes)


def _write(ds, ck, *, world_size=2, epoch=0, step=None, identity=True, **changes) -> str:
    model = torch.nn.Linear(8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    ident = resume.identity(_config(ds, ck, **changes), ds, world_size) if identity else None
    return checkpoint.save(str(ck), epoch, model, optimizer, {"history": []}, step=step, identity=ident)


# (id, how the checkpoint was written, the job resuming it, words of the one-line refusal)
MISMATCH_CASES = [
    ("hidden", {}, {"hidden": 64}, "belongs to another job: hidden 128 there, 64 now; give --hidden 128 as before"),
    ("model", {}, {"model": "gin"}, "model sage there, gin now; give --model sage as before"),
    ("fanout", {}, {"fanout": (5,)}, "fanout 15,10 there, 5 now; give --fanout 15,10 as before"),
    ("task", {}, {"task": "link"}, "task node there, link now; give --task node as before"),
    ("batch size", {}, {"batch_size": 64}, "batch_size 512 there, 64 now; give --batch-size 512 as before"),
    ("time attr", {}, {"time_attr": "t"}, "time_attr None there, t now; drop --time-attr"),
    ("ranks inside an epoch", {"step": 3}, {"world_size": 3},
     "written at step 3 of epoch 1 by 2 ranks, and the job now has 3; a resume inside an epoch needs the same "
     "ranks: give --nproc 2"),
    ("finished", {"epoch": 2}, {"epochs": 3},
     "has finished epoch 3 and --epochs is 3: nothing is left to train; give --epochs 4 or more"),
]


@pytest.mark.parametrize("case,written,given,words", MISMATCH_CASES, ids=[c[0] for c in MISMATCH_CASES])
def test_a_checkpoint_of_another_job_is_refused_at_the_door(datasets, tmp_path, case, written, given, words):
    ds, ck = datasets["ds"], tmp_path / "ck"
    path = _write(ds, ck, **written)
    world_size = given.pop("world_size", 2)
    with pytest.raises(CheckpointMismatchError) as info:
        checks.check_resume(_config(ds, ck, **given), ds, world_size)
    assert words in str(info.value) and path in str(info.value), str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_another_dataset_of_the_same_shape_is_refused(datasets, tmp_path):
    ck = tmp_path / "ck"
    _write(datasets["ds"], ck)
    twin = datasets["twin"]
    with pytest.raises(CheckpointMismatchError) as info:
        checks.check_resume(_config(twin, ck), twin, 2)
    text = str(info.value)
    assert "belongs to another job: dataset 'synthetic" in text and twin.url in text, text
    assert "resume on the dataset it was trained on" in text and len(text.splitlines()) == 1


def test_the_same_dataset_copied_elsewhere_is_the_same_job(datasets, tmp_path):
    import shutil

    ck, ds = tmp_path / "ck", datasets["ds"]
    _write(ds, ck)
    copy = graphstore.open_dataset(shutil.copytree(ds.url, tmp_path / "copy"))
    assert checks.check_resume(_config(copy, ck), copy, 2) == []


# (id, how the checkpoint was written, the job resuming it, words of the line said once)
SAID_CASES = [
    ("lr", {}, {"lr": 0.01}, "--lr 0.01 applies from epoch 2 on (checkpoint"),
    ("epochs", {}, {"epochs": 5}, "--epochs 5 applies from epoch 2 on"),
    ("ranks at an epoch's end", {}, {"world_size": 4}, "4 ranks go on from checkpoint"),
    ("no identity (older graphstore)", {"identity": False}, {}, "was written without its job's identity"),
]


@pytest.mark.parametrize("case,written,given,words", SAID_CASES, ids=[c[0] for c in SAID_CASES])
def test_what_may_change_on_resume_is_said_once(datasets, tmp_path, case, written, given, words):
    ds, ck = datasets["ds"], tmp_path / "ck"
    _write(ds, ck, **written)
    world_size = given.pop("world_size", 2)
    said = checks.check_resume(_config(ds, ck, **given), ds, world_size)
    assert len(said) == 1 and words in said[0] and "\n" not in said[0], said


def test_the_same_job_resumes_silently_and_without_resume_nothing_is_read(datasets, tmp_path):
    ds, ck = datasets["ds"], tmp_path / "ck"
    _write(ds, ck)
    assert checks.check_resume(_config(ds, ck), ds, 2) == []
    assert checks.check_resume(dataclasses.replace(_config(ds, ck), resume=False), ds, 2) == []
    assert checks.check_resume(_config(ds, tmp_path / "empty"), ds, 2) == []


def test_restore_applies_the_new_learning_rate(datasets, tmp_path):
    _write(datasets["ds"], tmp_path)
    model = torch.nn.Linear(8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    assert checkpoint.restore(checkpoint.load_latest(str(tmp_path)), model, optimizer, lr=0.01) == (1, 0)
    assert [g["lr"] for g in optimizer.param_groups] == [0.01]


class Foreign:
    """Any class of someone else's: a checkpoint never pickles one."""


def _garbage(ck):
    (ck / "checkpoint-epoch0000.pt").write_bytes(b"\x00garbage" * 10)


def _foreign_pt(ck):
    torch.save(torch.nn.Linear(2, 2).state_dict(), ck / "checkpoint-epoch0000.pt")


def _foreign_object(ck):
    torch.save({"epoch": 0, "model": Foreign(), "optimizer": {}}, ck / "checkpoint-epoch0000.pt")


def _truncated(ck):
    path = ck / "checkpoint-epoch0000.pt"
    path.write_bytes(path.read_bytes()[:300])


def _pointer(file):
    return lambda ck: (ck / "latest.json").write_text(json.dumps({"epoch": 0, "step": None, "file": file}))


def _link_out(ck):
    (ck.parent / "elsewhere.pt").write_bytes((ck / "checkpoint-epoch0000.pt").read_bytes())
    os.symlink(ck.parent / "elsewhere.pt", ck / "link.pt")
    _pointer("link.pt")(ck)


# (id, what is done to a good checkpoint directory, words of the one-line refusal)
NOT_OURS_CASES = [
    ("garbage bytes", _garbage, "is not a checkpoint graphstore wrote (not a PyTorch file)"),
    ("a foreign .pt", _foreign_pt, "is a PyTorch file but not a graphstore checkpoint"),
    ("a foreign object", _foreign_object, "holds Python objects a checkpoint never does"),
    ("truncated", _truncated, "is unreadable"),
    ("pointer up and out", _pointer("../elsewhere.pt"), "names '../elsewhere.pt', not a file of"),
    ("pointer absolute", _pointer("/etc/passwd"), "names '/etc/passwd', not a file of"),
    ("pointer to a link out", _link_out, "names 'link.pt', a link to"),
    ("pointer to nothing", _pointer("gone.pt"), "names checkpoint 'gone.pt', which is not in"),
    ("pointer garbage", lambda ck: (ck / "latest.json").write_text("{nope"), "latest.json is unreadable"),
]


@pytest.mark.parametrize("case,damage,words", NOT_OURS_CASES, ids=[c[0] for c in NOT_OURS_CASES])
def test_a_file_that_is_no_checkpoint_of_ours_is_refused(datasets, tmp_path, case, damage, words):
    ds, ck = datasets["ds"], tmp_path / "ck"
    _write(ds, ck)
    damage(ck)
    with pytest.raises(GraphstoreError) as info:
        checks.check_resume(_config(ds, ck), ds, 2)
    assert words in str(info.value) and len(str(info.value).splitlines()) == 1, str(info.value)
    with pytest.raises(GraphstoreError):
        checkpoint.load_latest(str(ck))  # the trainer's read refuses it too


CLI_CASES = [("garbage bytes", _garbage, "not a PyTorch file"), ("pointer out", _pointer("../x.pt"), "not a file of")]


@pytest.mark.parametrize("case,damage,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_graphstore_train_refuses_a_bad_checkpoint_before_ranks_start(datasets, tmp_path, capsys, monkeypatch,
                                                                     case, damage, words):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started: the check must come before")

    ds, ck = datasets["ds"], tmp_path / "ck"
    _write(ds, ck)
    damage(ck)
    monkeypatch.setattr("training.launch.launch_local", no_ranks)
    assert main([ds.url, "--no-progress", "--resume", "--checkpoint-dir", str(ck)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


# -- writes: whole or not at all, the cause named --

WRITE_ERRORS = [
    (errno.ENOSPC, StorageError, "no space left on the device at"),
    (errno.EDQUOT, StorageError, "the disk quota is used up"),
    (errno.EROFS, StorageError, "is a read-only file system (EROFS)"),
    (errno.EACCES, PermissionError, "permission denied (EACCES)"),
    (errno.EIO, StorageError, "(EIO); check the disk"),
]


@pytest.mark.parametrize("code,kind,words", WRITE_ERRORS, ids=[errno.errorcode[c[0]] for c in WRITE_ERRORS])
def test_a_failed_write_is_named_and_leaves_no_partial_file(datasets, tmp_path, monkeypatch, code, kind, words):
    ds, ck = datasets["ds"], tmp_path / "ck"
    first = _write(ds, ck)
    before = sorted(os.listdir(ck))

    def fail(fd, data):
        os.write(fd, bytes(data)[:100])  # part of it on disk, then the device refuses
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("training.loop.checkpoint._write_all", fail)
    with pytest.raises(kind) as info:
        _write(ds, ck, epoch=1)
    text = str(info.value)
    assert words in text and str(ck) in text and "checkpoint-epoch0001.pt" in text, text
    assert isinstance(info.value, GraphstoreError) and len(text.splitlines()) == 1
    assert sorted(os.listdir(ck)) == before, "a partial file was left"
    assert checkpoint.latest_path(str(ck)) == first


def test_a_full_disk_is_named_as_such(datasets, tmp_path):
    """A real 1 MB tmpfs (root only) and a 2 MB model."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        model = torch.nn.Linear(512, 1024)
        with pytest.raises(StorageError, match="no space left on the device at"):
            checkpoint.save(str(mount / "ck"), 0, model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert os.listdir(mount / "ck") == []
    finally:
        subprocess.run(["umount", "-l", str(mount)])


# -- one job per checkpoint directory --

def test_a_second_job_on_one_checkpoint_dir_is_refused(tmp_path):
    ck = tmp_path / "ck"
    with checkpoint.claimed(str(ck)):
        with pytest.raises(CheckpointDirClaimedError) as info:
            with checkpoint.claimed(str(ck)):
                pass
        text = str(info.value)
        assert f"--checkpoint-dir {ck} is in use by another graphstore-train job" in text, text
        assert f"pid {os.getpid()}" in text and len(text.splitlines()) == 1
    assert not ck.exists(), "the directory made for the claim was left behind"


def test_the_claim_of_a_dead_job_is_taken_over(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = dataclasses.replace(Holder.here(str(ck)), pid=dead.pid, token="dead")
    (ck / ".graphstore-train.claim").write_bytes(stale.to_bytes())
    with checkpoint.claimed(str(ck)) as claim:
        assert claim.holder.pid == os.getpid()
    assert os.listdir(ck) == [], "the claim was left behind"


def test_a_claim_from_another_host_names_the_file_to_delete(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    other = dataclasses.replace(Holder.here(str(ck)), host="elsewhere", machine="x")
    (ck / ".graphstore-train.claim").write_bytes(other.to_bytes())
    with pytest.raises(CheckpointDirClaimedError, match=r"this host cannot tell\), delete .*\.graphstore-train\.claim"):
        with checkpoint.claimed(str(ck)):
            pass


# -- the dataset, checked where it is used: damage with valid checksums refused before any rank starts --

DOOR_CASES = [row for row in STORED_CASES if "/edges/" not in row[1][0][0]]  # topology: checked by each rank


@pytest.mark.parametrize("case,changes,words", DOOR_CASES, ids=[c[0] for c in DOOR_CASES])
def test_stored_labels_are_checked_at_the_training_door(datasets, tmp_path, capsys, monkeypatch, case, changes,
                                                        words):
    import shutil

    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started: the check must come before")

    copy = str(shutil.copytree(datasets["ds"].url, tmp_path / "ds"))
    r = damage_stored(copy, changes)
    monkeypatch.setattr("training.launch.launch_local", no_ranks)
    assert main([copy, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert words.format(r=r) in err and f"`graphstore verify {copy}` lists every problem" in err, err
    assert len(err.splitlines()) == 1
