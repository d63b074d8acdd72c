"""The per-epoch timing breakdown adds up: foreground parts sum to the training time, background apart; the same
run's TensorBoard scalars (rank 0 writes them) are its metrics."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.training.conftest import metrics, run_train
from training.report.timing import BACKGROUND, FOREGROUND, WITHIN

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_foreground_parts_add_up_to_the_training_time_and_tensorboard_shows_each_epoch(synthetic2, tmp_path):
    board = tmp_path / "tb"
    tensorboard = importlib.util.find_spec("tensorboard") is not None  # the test extra installs it
    out = run_train(synthetic2, "--nproc", 2, "--epochs", 2, "--fanout", "10,5", "--batch-size", 64,
                    "--metrics-out", tmp_path / "m.json", *(("--tensorboard", board) if tensorboard else ()))
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    assert doc["timing_parts"]["foreground"] == list(FOREGROUND)
    assert doc["timing_parts"]["background"] == list(BACKGROUND)
    first, second = doc["epochs"]
    for record in (first, second):
        t, train = record["timing"], record["train_seconds"]
        assert set(FOREGROUND) | set(BACKGROUND) | set(WITHIN) <= set(t), t
        foreground = sum(t[k] for k in FOREGROUND)
        assert abs(foreground - train) <= 0.1 * train, (foreground, record)
        # the prefetch thread is one thread started inside the epoch: its work fits in the epoch
        assert sum(t[k] for k in BACKGROUND) <= 1.1 * train, record
        assert t["grad_sync"] <= t["forward_backward"] * 1.1 + 0.01, record
    # the batch that builds the model is not charged to epoch 1: same steps, same remote requests
    assert first["steps"] == second["steps"] == 7  # ceil(400 / 64) on both ranks: no cycling
    assert first["remote"]["requests"] == second["remote"]["requests"] > 0, (first["remote"], second["remote"])
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("epoch 1/2"))
    assert f"training {first['train_seconds']:.1f} s = data wait" in line and "prefetch thread, overlapping" in line
    if tensorboard:
        _the_board_shows_the_metrics(board, doc["epochs"])


def _the_board_shows_the_metrics(board, epochs: list[dict]) -> None:
    from tests.training.test_tensorboard import _board

    assert len([f for f in os.listdir(board) if f.startswith("events.out.tfevents.")]) == 1, os.listdir(board)
    acc = _board(board)
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2]
    assert [e.value for e in loss] == pytest.approx([e["loss"] for e in epochs], rel=1e-6)  # float32 on disk
    assert [e.value for e in acc.Scalars("val/accuracy")] == pytest.approx([e["val_acc"] for e in epochs], rel=1e-6)
    tags = set(acc.Tags()["scalars"])
    assert {"time/data_wait_s", "time/data_wait_share", "time/forward_backward_s", "io/wire_bytes"} <= tags, tags
    share = [e.value for e in acc.Scalars("time/data_wait_share")]
    assert share == pytest.approx([e["timing"]["data_wait"] / e["train_seconds"] for e in epochs], rel=1e-5)
