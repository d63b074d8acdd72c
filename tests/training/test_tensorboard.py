"""``graphstore-train --tensorboard DIR``: the writer on a made-up record, read back by TensorBoard's own reader;
without the tensorboard package the flag is refused at the door in one line. A real run's board is checked
beside its timing (tests/training/test_timing.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

import graphstore
from tests.training.conftest import synthetic_source
from training.launch import main
from training.report.tensorboard import EpochWriter, scalars

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="the tensorboard extra (pip install 'graphstore[tensorboard]')")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """400 labelled nodes in one partition: ranks sharing it train it in seconds, with no RPC."""
    dest = tmp_path_factory.mktemp("tb") / "tiny"
    graphstore.ingest(synthetic_source(n=400), dest, num_parts=1)
    return str(dest)


def _board(directory):
    """TensorBoard's own reader over the event files in ``directory``, loaded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return acc


def _record(epoch: int, loss: float) -> dict:
    """An epoch record shaped like training.loop.trainer's (after reduce_record and _per_step)."""
    return {"epoch": epoch, "loss": loss, "train_acc": 0.6, "val_acc": 0.7, "test_acc": 0.65, "train_seconds": 2.0,
            "eval_seconds": 0.5, "epoch_seconds": 2.5, "steps": 10, "evaluation": "full",
            "timing": {"data_wait": 0.5, "forward_backward": 1.0, "optimizer": 0.2, "step_sync": 0.1,
                       "epoch_end": 0.1, "sampling": 0.8, "feature_fetch": 0.3, "grad_sync": 0.05, "remote_wait": 0.2},
            "remote": {"requests": 40.0, "rows": 900.0, "cache_hits": 30.0, "cache_misses": 10.0},
            "gpu_cache": {"hits": 75, "misses": 25, "rows": 100},
            "wire": {"bytes": {"neighbours": 100, "rows": 300, "allreduce": 600}},
            "memory_mb": {"peak_rss": [500.0, 520.0]}, "per_step": {"data_wait": 0.05, "compute": 0.12}}


@needs_tensorboard
def test_writer_turns_a_record_into_named_scalars(tmp_path):
    board = EpochWriter(str(tmp_path))
    board.write(_record(1, 0.9))
    board.write(_record(2, 0.4))
    board.close()
    acc = _board(tmp_path)
    got = {tag: [(e.step, round(e.value, 5)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert got["train/loss"] == [(1, 0.9), (2, 0.4)]
    want = {"train/accuracy": 0.6, "val/accuracy": 0.7, "test/accuracy": 0.65, "time/data_wait_s": 0.5,
            "time/data_wait_share": 0.25, "time/other_s": 0.1, "time/eval_s": 0.5, "time/per_step/compute_s": 0.12,
            "io/wire_bytes": 1000, "io/wire_bytes/rows": 300, "io/remote_requests": 40, "cache/hits": 30,
            "cache/hit_share": 0.75, "gpu_cache/hits": 75, "gpu_cache/hit_share": 0.75,
            "memory/peak_rss_mb_max": 520}
    assert {tag: got[tag][-1] for tag in want} == {tag: (2, value) for tag, value in want.items()}


def test_scalars_take_only_what_the_record_has():
    loader_only = {"epoch": 1, "loader_batches_per_s": [12.5, 11.0], "train_seconds": 0.0, "timing": {},
                   "val_auc": 0.8}
    got = scalars(loader_only)
    assert got == {"loader/batches_per_s/rank0": 12.5, "loader/batches_per_s/rank1": 11.0, "val/auc": 0.8,
                   "time/train_s": 0.0}


@needs_tensorboard
def test_a_resumed_run_hides_the_epochs_it_trains_again(tmp_path):
    first = EpochWriter(str(tmp_path))
    for epoch, loss in ((1, 0.9), (2, 0.5), (3, 0.3)):
        first.write(_record(epoch, loss))
    first.close()
    again = EpochWriter(str(tmp_path), resume=True)  # resumed from the checkpoint of epoch 1
    again.write(_record(2, 0.45))
    again.close()
    assert [(e.step, round(e.value, 5)) for e in _board(tmp_path).Scalars("train/loss")] == [(1, 0.9), (2, 0.45)]


def test_without_tensorboard_the_flag_is_refused_at_the_door(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import now raises ImportError
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    assert main([tiny, "--no-progress", "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("graphstore-train: error: --tensorboard") and "pip install 'graphstore[tensorboard]'" in err
    assert os.listdir(tmp_path) == []


@needs_tensorboard
def test_the_directory_is_tried_at_the_door(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("mine")
    monkeypatch.setattr("training.launch.launch_local", _no_ranks)
    assert main([tiny, "--no-progress", "--tensorboard", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tensorboard" in err and "is a file" in err, err
    started = []
    monkeypatch.setattr("training.launch.launch_local", lambda config, nproc, grace: started.append(config) or 0)
    assert main([tiny, "--no-progress", "--tensorboard", str(tmp_path / "new" / "tb")]) == 0
    assert started[0].tensorboard == str(tmp_path / "new" / "tb")
    assert os.listdir(tmp_path) == ["file"], "the directory tried at the door was left behind"


def _no_ranks(*args, **kwargs):
    raise AssertionError("ranks were started: the check must come before")
