"""graphstore-train beyond homogeneous node classification: link prediction, heterogeneous graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from tests.conftest import shared_data
from tests.training.conftest import metrics, run_train

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_temporal_link_prediction_on_bitcoin_otc_two_ranks(tmp_path):
    from torch_geometric.data import Data

    table = np.loadtxt(shared_data("bitcoin_otc", "soc-sign-bitcoinotc.csv"), delimiter=",",
                       dtype=np.float64).astype(np.int64)
    nodes, inverse = np.unique(table[:, :2], return_inverse=True)
    edges = inverse.reshape(-1, 2).T.copy()
    data = Data(edge_index=torch.from_numpy(edges), num_nodes=len(nodes), time=torch.from_numpy(table[:, 3]))
    graphstore.ingest(data, tmp_path / "btc", num_parts=2)
    out = run_train(tmp_path / "btc", "--nproc", 2, "--task", "link", "--time-attr", "time", "--epochs", 3,
                    "--fanout", "10,5", "--batch-size", 512, "--lr", 0.01, "--hidden", 32,
                    "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    last = metrics(tmp_path / "m.json")["epochs"][-1]
    # the later 10% of links by time, scored without leakage (no held-out or scored link carries messages):
    # 0.67 measured (0.83 when links leaked); no node features here, so the baseline is chance (0.5)
    assert last["test_auc"] > 0.6, last
    assert last["remote"]["requests"] > 0


def test_link_task_names_an_unknown_edge_type(tmp_path):
    from tests.conftest import small_hetero

    data, _ = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=1)
    out = run_train(tmp_path / "h", "--task", "link", "--edge-type", "likes", "--epochs", 1)
    assert out.returncode == 2 and "edge type ('likes',) is not in dataset" in out.stderr


def test_heterogeneous_node_classification_runs_with_a_target(tmp_path):
    from tests.conftest import small_hetero

    data, _ = small_hetero()
    graphstore.ingest(data, tmp_path / "h", num_parts=2)
    out = run_train(tmp_path / "h", "--nproc", 2, "--epochs", 2, "--fanout", "5,5", "--batch-size", 32,
                    "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    doc = metrics(tmp_path / "m.json")
    assert doc["config"]["target"] is None and len(doc["epochs"]) == 2
    bad = run_train(tmp_path / "h", "--nproc", 2, "--target", "author", "--epochs", 1)
    assert bad.returncode == 2 and "--target 'author' has no y/train_mask" in bad.stderr


def test_to_hetero_graphsage_learns_on_a_mag_shaped_graph(tmp_path):
    graphstore.ingest("synthetic-mag:papers=4000,classes=8,features=32", tmp_path / "mag", num_parts=2)
    out = run_train(tmp_path / "mag", "--nproc", 2, "--epochs", 3, "--fanout", "5,5", "--batch-size", 128,
                    "--lr", 0.01, "--hidden", 32, "--metrics-out", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    last = metrics(tmp_path / "m.json")["epochs"][-1]
    assert last["test_acc"] > 0.5, last  # 8 venues: chance is 0.125
    assert last["remote"]["requests"] > 0


def test_link_prediction_on_a_heterogeneous_edge_type_and_triplet_mrr(tmp_path):
    graphstore.ingest("synthetic-mag:papers=3000,classes=8,features=16", tmp_path / "mag", num_parts=2)
    link = ("--nproc", 2, "--task", "link", "--edge-type", "writes", "--epochs", 2, "--eval-every", 2)
    out = run_train(tmp_path / "mag", *link, "--fanout", "5,5", "--batch-size", 512, "--lr", 0.01, "--hidden", 32,
                    "--metrics-out", tmp_path / "auc.json")
    assert out.returncode == 0, out.stderr
    assert metrics(tmp_path / "auc.json")["epochs"][-1]["test_auc"] > 0.6
    out = run_train(tmp_path / "mag", *link, "--neg-sampling", "triplet", "--fanout", "5,5", "--batch-size", 512,
                    "--lr", 0.01, "--hidden", 32, "--metrics-out", tmp_path / "mrr.json")
    assert out.returncode == 0, out.stderr
    last = metrics(tmp_path / "mrr.json")["epochs"][-1]
    # 5 negatives per link: a random scorer's MRR is (1 + 1/2 + ... + 1/6) / 6 = 0.41
    assert last["test_mrr"] > 0.5, last
