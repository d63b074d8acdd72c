"""graphstore-train end to end: evaluation cadence and subset, peak memory per rank, threads, loader-only."""

from __future__ import annotations

import os

import pytest

from training.launcher import allocator

from tests.training.conftest import metrics, run_train

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_eval_cadence_subset_and_peak_memory_in_the_metrics(synthetic2, tmp_path):
    out = run_train(synthetic2, "--nproc", 2, "--epochs", 3, "--fanout", "5,5", "--batch-size", 32,
                    "--eval-every", 2, "--eval-max-batches", 2, "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    jemalloc = "jemalloc" in allocator.preload_env(dict(os.environ)).get("LD_PRELOAD", "")
    expected_allocator = "jemalloc" if jemalloc else "glibc-tuned"  # graphstore-train's choice in this environment
    first, second, last = doc["epochs"]
    assert first["evaluation"] == "none" and "val_acc" not in first and first["next_evaluation"] == 2
    assert second["evaluation"] == "subset" and last["evaluation"] == "full"
    assert "val_acc" in second and "test_acc" in last
    # a rank's share of val+test is 300 nodes: 10 batches of 32 per split; the subset takes 2 of them
    assert 0 < second["remote_eval"]["requests"] < last["remote_eval"]["requests"] / 2, (second, last)
    assert first["epoch_seconds"] - first["train_seconds"] < last["eval_seconds"]
    lines = [line for line in out.stdout.splitlines() if line.startswith("epoch ")]
    assert "no evaluation, next after epoch 2" in lines[0]
    assert ", subset)" in lines[1] and f"evaluation {last['eval_seconds']:.1f} s)" in lines[2]
    for record in doc["epochs"]:
        mem = record["memory_mb"]
        assert len(mem["peak_rss"]) == 2 and all(p >= r > 0 for p, r in zip(mem["peak_rss"], mem["rss"])), mem
        assert all(h > 0 for h in mem["heap_in_use"]), mem
        assert set(record["per_step"]) == {"data_wait", "compute"} and record["per_step"]["compute"] > 0
        assert record["allocator"] == expected_allocator, record
        compiled = record["kernels_compiled"]  # per rank: this epoch's compiles within the run's so far
        assert len(compiled["run"]) == 2 and all(0 <= e <= r for e, r in zip(compiled["epoch"], compiled["run"]))
    runs = [record["kernels_compiled"]["run"] for record in doc["epochs"]]
    assert all(a <= b for earlier, later in zip(runs, runs[1:]) for a, b in zip(earlier, later)), runs
    assert "peak RSS/rank GiB: " in lines[0]
    assert doc["threads"]["local_ranks"] == 2 and doc["threads"]["threads"] >= 1


def test_loader_only_feeds_no_model(synthetic2, tmp_path):
    out = run_train(synthetic2, "--nproc", 2, "--epochs", 2, "--fanout", "5,5", "--batch-size", 64, "--loader-only",
                    "--threads", 1, "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    last = doc["epochs"][-1]
    assert "loss" not in last and last["evaluation"] == "none" and last["remote"]["requests"] > 0
    rates = last["loader_batches_per_s"]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert doc["threads"] == {"threads": 1, "usable_cores": doc["threads"]["usable_cores"], "local_ranks": 2,
                              "source": "--threads"}
    assert "batches/s per rank" in out.stdout


def test_the_epoch_line_names_kernels_compiled_in_the_epoch():
    from training.launch import _compiled_text

    assert _compiled_text({"kernels_compiled": {"epoch": [0, 0], "seconds": [0.0, 0.0], "run": [4, 4]}}) == ""
    assert _compiled_text({}) == ""
    text = _compiled_text({"kernels_compiled": {"epoch": [9, 0], "seconds": [41.04, 0.0], "run": [9, 4]}})
    assert text.startswith("  kernels compiled/rank: 9, 0 (41.0 s;") and "graphstore warmup" in text


def test_compiled_per_rank_counts_a_compile_in_this_process(tmp_path):
    """One rank (a gloo group of one): a kernel compiled after ``before`` counts in ``epoch`` and ``run``."""
    import numba
    import torch.distributed as dist

    from graphstore import jitcache
    from training.report.memory import compiled_per_rank

    before = jitcache.compile_counts()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)

    def add_one(x):
        return x + 1

    add_one.__module__ = "training.probe"  # counted as a project kernel; never cached, so it compiles now
    try:
        assert numba.njit(add_one)(1) == 2
        got = compiled_per_rank(before)
    finally:
        dist.destroy_process_group()
    assert got["epoch"][0] >= 1 and got["run"][0] >= got["epoch"][0] and got["seconds"][0] >= 0, got
