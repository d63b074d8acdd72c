"""Training on two rig hosts (network namespaces) exactly as the README says, and faults across hosts."""

from __future__ import annotations

import pytest

import graphstore
from tests.conftest import shared_data
from tests.training.conftest import metrics
from tests.training.multihost import srun_rank, torchrun, wait_all

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
TRAIN = ("--fanout", "10,10", "--batch-size", 32, "--lr", 0.01, "--hidden", 32)


@pytest.fixture(scope="module")
def cora_shared(tmp_path_factory):
    """Cora in 2 partitions on a local path both rig hosts see (stands in for NFS): nothing is copied."""
    dest = tmp_path_factory.mktemp("shared") / "cora2"
    graphstore.ingest(f"planetoid:{shared_data('planetoid', 'Cora', 'raw')}", dest, num_parts=2)
    return dest


def _no_process_left(cluster) -> None:
    assert all(cluster.pids(h) == [] for h in cluster.hosts), {h.netns: cluster.pids(h) for h in cluster.hosts}


def test_torchrun_on_two_hosts_trains_without_ifname_variables(rig, cora_shared, tmp_path):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    runs = [torchrun(cluster, h, 2, h0.addr, cora_shared, "--epochs", 4, *TRAIN, "--timeout", 60,
                     "--metrics-out", tmp_path / "m.json") for h in (h0, h1)]
    outcomes = wait_all(runs, 400)
    for host, o in zip((h0, h1), outcomes):
        assert o.code == 0, f"{host.netns}: exit {o.code}\n{o.stderr[-3000:]}"
        assert f"uses interface eth0 ({host.addr}, from the route to MASTER_ADDR {h0.addr})" in o.stderr
    doc = metrics(tmp_path / "m.json")
    assert doc["world_size"] == 2 and doc["num_parts"] == 2
    assert doc["epochs"][-1]["test_acc"] >= 0.6, doc["epochs"][-1]
    assert doc["epochs"][-1]["remote"]["requests"] > 0, "the two hosts must have talked"
    _no_process_left(cluster)
