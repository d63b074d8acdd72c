"""Train from a dataset on S3 (moto) and write inference results back to it: nothing copied by hand."""

from __future__ import annotations

import pytest

import graphstore
from tests.conftest import shared_data
from tests.graphstore.conftest import moto_endpoint, s3  # noqa: F401  (fixtures)
from tests.training.conftest import metrics, run_train

pytestmark = [pytest.mark.s3, pytest.mark.distributed, pytest.mark.slow]


def test_train_from_s3_and_write_predictions_back(s3, tmp_path):  # noqa: F811
    url = s3.url("cora")
    graphstore.ingest(f"planetoid:{shared_data('planetoid', 'Cora', 'raw')}", url, num_parts=2,
                      storage_options=s3.storage_options)
    out = run_train(url, "--nproc", 2, "--epochs", 4, "--eval-every", 4, "--fanout", "10,10", "--batch-size", 32, "--lr", 0.01,
                    "--hidden", 32, *s3.cli_options(), "--cache-dir", tmp_path / "cache", "--infer-out", "logits",
                    "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    assert doc["epochs"][-1]["test_acc"] > 0.6
    assert doc["config"]["storage_options"] == ["client_kwargs"], "option values never reach the metrics file"
    ds = graphstore.open_dataset(url, s3.storage_options, cache_dir=tmp_path / "reader-cache")
    assert [o.name for o in ds.manifest.outputs] == ["logits"]
    from graphstore.dataset.whole import DatasetFeatureStore

    logits = DatasetFeatureStore(ds)[None, "logits", None]
    assert logits.shape == (2708, 7) and bool(logits.abs().sum() > 0)
