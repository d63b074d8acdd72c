"""tools/bench_rank_memory.py: ratios against the first dataset, rank by rank; a job that never wrote its epoch."""

from __future__ import annotations

import argparse
import sys

from tests.tools.conftest import load_tool

bench = load_tool("bench_rank_memory")


def test_ratios_take_each_rows_largest_rank_against_the_first_datasets():
    rows = [{"dataset": "small", "peak_rss_mb": [100.0, 120.0], "private_peak_mb": [50.0, 40.0],
             "dataset_pages_mb": [10.0, 10.0]},
            {"dataset": "large", "peak_rss_mb": [300.0, 240.0], "private_peak_mb": [55.0, 60.0],
             "dataset_pages_mb": [80.0, 90.0]},
            {"dataset": "large", "failed": "exit -9"}]
    bench._ratios(rows, "small")
    assert rows[0]["peak_rss_ratio"] == 1.0 and rows[1]["peak_rss_ratio"] == 2.5
    assert rows[1]["private_peak_ratio"] == 1.2 and rows[1]["dataset_pages_ratio"] == 9.0
    assert "peak_rss_ratio" not in rows[2]


def test_a_job_that_writes_no_epoch_is_reported_failed(tmp_path, monkeypatch):
    # a "launcher" that exits at once: no metrics, so the row says so with the exit code
    monkeypatch.setattr(sys, "executable", "/bin/false")
    args = argparse.Namespace(ranks=2, eval_max_batches=1, fanout="2", batch_size=4, seed=1, max_seconds=30)
    job = bench.train(str(tmp_path / "none"), args, tmp_path)
    assert job["failed"].startswith("exit 1, no epoch recorded")
