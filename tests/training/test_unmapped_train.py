"""graphstore-train --unmapped: ranks that read their partitions with pread train the same model as mapped
ones, with none of the dataset's files mapped (so none of its pages in their resident sets); what it does not
serve is refused in one line."""

from __future__ import annotations

import pytest

from tests.training.conftest import metrics, run_train

FLAGS = ("--nproc", 2, "--epochs", 1, "--fanout", "5,5", "--batch-size", 64, "--seed", 3)


def test_unmapped_ranks_train_the_same_model_mapping_no_dataset_file(synthetic2, tmp_path):
    """Plain mapped ranks against unmapped ones whose features go through the disk reader and its RAM cache
    (``--feature-cache``: direct I/O where the file system allows it): the same batches, so the same model."""
    mapped = run_train(synthetic2, *FLAGS, "--metrics-out", tmp_path / "a.json")
    assert mapped.returncode == 0, mapped.stderr
    unmapped = run_train(synthetic2, *FLAGS, "--unmapped", "--feature-cache", "16KB", "--metrics-out",
                         tmp_path / "b.json")
    assert unmapped.returncode == 0, unmapped.stderr
    a, b = metrics(tmp_path / "a.json")["epochs"][0], metrics(tmp_path / "b.json")["epochs"][0]
    assert (a["loss"], a["train_acc"], a["val_acc"]) == (b["loss"], b["train_acc"], b["val_acc"])
    assert min(a["memory_mb"]["dataset_rss"]) > 0  # mapped ranks do hold dataset pages: the measure sees them
    assert min(a["memory_mb"]["dataset_mapped"]) > 0  # and map its files
    assert b["memory_mb"]["dataset_rss"] == [0.0, 0.0]
    assert b["memory_mb"]["dataset_mapped"] == [0.0, 0.0]  # none mapped, resident or not: the topology too
    feats = b["features"]
    assert feats["cache_bytes"] > 0 and 0 < feats["hits"] < feats["rows"] and feats["disk_bytes"] > 0
    assert "features" not in a or not a["features"]  # the mapped run read no row through the disk reader


@pytest.mark.parametrize("flags, named", [(("--task", "link"), "--task link"),
                                          (("--time-attr", "time"), "--time-attr")])
def test_what_unmapped_ranks_do_not_serve_is_refused_in_one_line(synthetic2, flags, named):
    done = run_train(synthetic2, "--unmapped", *flags)
    assert done.returncode == 2
    assert named in done.stderr and "--unmapped" in done.stderr and len(done.stderr.strip().splitlines()) <= 3
