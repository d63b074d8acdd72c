"""The per-epoch timing breakdown adds up: foreground parts sum to the training time, background apart."""

from __future__ import annotations

import pytest

from tests.training.conftest import metrics, run_train
from training.report.timing import BACKGROUND, FOREGROUND, WITHIN

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_foreground_parts_add_up_to_the_training_time(synthetic2, tmp_path):
    out = run_train(synthetic2, "--nproc", 2, "--epochs", 2, "--fanout", "10,5", "--batch-size", 64,
                    "--metrics-out", tmp_path / "m.json")
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
