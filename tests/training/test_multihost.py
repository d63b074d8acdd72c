"""Training on two rig hosts (network namespaces) exactly as docs/training.md says, and faults across hosts."""

from __future__ import annotations

import time

import pytest

import graphstore
from tests.conftest import shared_data
from tests.training.conftest import metrics, opened_under
from tests.training.multihost import run_cli, srun_rank, torchrun, wait_all

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
TRAIN = ("--fanout", "10,10", "--batch-size", 32, "--lr", 0.01, "--hidden", 32)


@pytest.fixture(scope="module")
def cora_shared(tmp_path_factory):
    """Cora in 2 partitions on a local path both rig hosts see (stands in for NFS): nothing is copied."""
    dest = tmp_path_factory.mktemp("shared") / "cora2"
    graphstore.ingest(f"planetoid:{shared_data('planetoid', 'Cora', 'raw')}", dest, num_parts=2)
    return dest


def test_torchrun_on_two_hosts_trains_from_one_s3_dataset_with_per_host_caches(rig, monkeypatch, tmp_path):
    """torchrun on two hosts, exactly as docs/training.md writes it, with no interface variables: each host
    finds its interface from the route to MASTER_ADDR. The dataset is on S3 (moto listens on the bridge
    address, the hosts' only way out); each host caches chunks in its own dir. One job checks both, and the
    wire counts of the epoch."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    from tests.graphstore.conftest import fake_credentials, new_bucket

    cluster = rig(2)
    h0, h1 = cluster.hosts
    fake_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("NO_PROXY", cluster.bridge_addr)
    monkeypatch.setenv("no_proxy", cluster.bridge_addr)
    server = ThreadedMotoServer(ip_address=cluster.bridge_addr, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = new_bucket(f"http://{host}:{port}")
        url = s3.url("cora")
        graphstore.ingest(f"planetoid:{shared_data('planetoid', 'Cora', 'raw')}", url, num_parts=2,
                          storage_options=s3.storage_options)
        runs = [torchrun(cluster, h, 2, h0.addr, url, "--epochs", 4, "--eval-every", 4, *TRAIN, "--timeout", 60,
                         *s3.cli_options(), "--cache-dir", tmp_path / f"cache-{h.index}",
                         "--metrics-out", tmp_path / "m.json")
                for h in (h0, h1)]
        outcomes = wait_all(runs, 400)
    finally:
        server.stop()
    for h, o in zip((h0, h1), outcomes):
        assert o.code == 0, f"{h.netns}: exit {o.code}\n{o.stderr[-3000:]}"
        assert f"uses interface eth0 ({h.addr}, from the route to MASTER_ADDR {h0.addr})" in o.stderr
    cached = [{p.name for p in (tmp_path / f"cache-{i}").rglob("*") if p.is_file()} for i in (0, 1)]
    assert cached[0] and cached[1], "each host filled its own cache"
    doc = metrics(tmp_path / "m.json")
    assert doc["world_size"] == 2 and doc["num_parts"] == 2
    last = doc["epochs"][-1]
    assert last["test_acc"] >= 0.6, last
    assert last["remote"]["requests"] > 0, "the two hosts must have talked"
    wire = last["wire"]  # bytes on the wire per peer and kind, and the gradient all-reduce
    assert [set(peers) for peers in wire["per_rank"]] == [{"1"}, {"0"}]
    assert wire["bytes"]["neighbours"] > 0 and wire["bytes"]["rows"] > 0
    calls = sum(k["calls"] for peers in wire["per_rank"] for kinds in peers.values() for k in kinds.values())
    assert calls == last["remote"]["requests"], "every remote request of the epoch is counted once"
    allreduce = wire["allreduce_per_rank"]
    assert allreduce[0] == allreduce[1] > 0 and allreduce[0] % last["steps"] == 0, "same buckets every step"
    assert "wire MB: allreduce" in outcomes[0].stdout
    _no_process_left(cluster)


def _no_process_left(cluster) -> None:
    assert all(cluster.pids(h) == [] for h in cluster.hosts), {h.netns: cluster.pids(h) for h in cluster.hosts}


# -- faults across hosts: every process ends non-zero within the bound, naming who was lost, and none is left --

def test_link_down_mid_epoch_ends_both_hosts_naming_the_lost_peer(rig, cora_shared):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    runs = [torchrun(cluster, h, 2, h0.addr, cora_shared, "--epochs", 200, "--eval-every", 200, *TRAIN,
                     "--batch-size", 8, "--timeout", 8) for h in (h0, h1)]
    assert runs[0].wait_for("epoch 1/200", 300), runs[0].stderr[-3000:]
    cluster.link_down(h1)  # packets dropped silently: the peers see silence, not a reset
    first, second = wait_all(runs, 90)
    assert first.code not in (None, 0) and second.code not in (None, 0), (first, second)
    assert f"lost rank 1 at {h1.addr}" in first.stderr, first.stderr[-3000:]
    assert f"rank 1 at {h1.addr}" in second.stderr and f"rank 0 at {h0.addr}" in second.stderr, second.stderr[-3000:]
    _no_process_left(cluster)


def test_killed_host_is_named_by_the_survivor(rig, cora_shared):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    runs = [srun_rank(cluster, h, h.index, 2, h0.addr, 29511, cora_shared, "--epochs", 200, "--eval-every", 200, *TRAIN,
                      "--batch-size", 8, "--timeout", 30) for h in (h0, h1)]
    assert runs[0].wait_for("epoch 1/200", 300), runs[0].stderr[-3000:]
    cluster.kill_host(h1)
    (survivor,) = wait_all(runs[:1], 90)
    assert survivor.code not in (None, 0), survivor
    assert f"lost rank 1 at {h1.addr}" in survivor.stderr, survivor.stderr[-3000:]
    _no_process_left(cluster)


@pytest.mark.parametrize("fault", ["wrong MASTER_ADDR", "closed port", "host never joins"])
def test_rendezvous_faults_are_bounded_and_named(rig, cora_shared, fault):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    port, timeout = 29512, 5
    args = (cora_shared, "--epochs", 1, *TRAIN, "--timeout", timeout)
    runs = [srun_rank(cluster, h0, 0, 2, h0.addr, port, *args)]
    if fault != "host never joins":
        master, rank1_port = (f"{cluster.subnet}.99", port) if fault == "wrong MASTER_ADDR" else (h0.addr, port + 1)
        runs.append(srun_rank(cluster, h1, 1, 2, master, rank1_port, *args))
    outcomes = wait_all(runs, timeout + 60)
    assert all(o.code not in (None, 0) for o in outcomes), outcomes
    assert f"rendezvous: rank(s) [1] never joined within {timeout} s" in outcomes[0].stderr, outcomes[0].stderr[-3000:]
    if fault != "host never joins":
        assert f"rank 1 at {h1.addr} (" in outcomes[1].stderr, outcomes[1].stderr[-3000:]
        assert f"rendezvous: cannot reach rank 0's rendezvous at {master}:{rank1_port}" in outcomes[1].stderr
    _no_process_left(cluster)


@pytest.mark.parametrize("fault", ["wrong MASTER_ADDR", "closed port"])
def test_torchrun_rendezvous_faults_end_both_hosts_within_the_agent_timeout(rig, cora_shared, fault):
    """torchrun as docs/training.md says, with its advice ``--rdzv-conf timeout=T``: torchrun's own agents
    rendezvous before our code runs, so they fail (both hosts) within T, naming what they waited for."""
    cluster = rig(2)
    h0, h1 = cluster.hosts
    timeout = 5
    master, port = (f"{cluster.subnet}.99", 29500) if fault == "wrong MASTER_ADDR" else (h0.addr, 29501)
    agent = ("--rdzv-conf", f"timeout={timeout}")
    args = (cora_shared, "--epochs", 1, *TRAIN, "--timeout", timeout)
    runs = [torchrun(cluster, h0, 2, h0.addr, *args, agent=agent),
            torchrun(cluster, h1, 2, master, *args, agent=agent, port=port)]
    first, second = wait_all(runs, timeout + 60)  # a code of None: still running at the bound, then killed
    assert first.code not in (None, 0) and second.code not in (None, 0), (first, second)
    assert "waiting for clients. 1/2 clients joined" in first.stderr, first.stderr[-3000:]
    assert f"({master}, {port})" in second.stderr, second.stderr[-3000:]  # the agent names what it tried
    _no_process_left(cluster)


# -- server-client mode across hosts: sampler servers on two hosts, a trainer that holds nothing on a third --

SERVE_PORT = 29600


def _served_job(cluster, dataset, *train_args, timeout: int = 60):
    """Servers 0 and 1 on hosts 0 and 1 (server 0's host is the rendezvous), ``graphstore-train --servers`` on
    host 2; returns the three runs."""
    h0, h1, h2 = cluster.hosts
    address = f"{h0.addr}:{SERVE_PORT}"
    servers = [run_cli(cluster, h, "serve", dataset, "--address", address, "--servers", 2, "--rank", h.index,
                       "--timeout", timeout) for h in (h0, h1)]
    trainer = run_cli(cluster, h2, "train", dataset, "--servers", address, "--timeout", timeout, "--no-progress",
                      *train_args)
    return servers, trainer


def test_two_sampler_server_hosts_train_a_trainer_host_that_opens_no_file_of_the_dataset(rig, cora_shared, tmp_path):
    cluster = rig(3)
    h0, h1, h2 = cluster.hosts
    servers, trainer = _served_job(cluster, cora_shared, "--epochs", 3, "--eval-every", 3, "--fanout", "10,5",
                                   "--batch-size", 32, "--metrics-out", tmp_path / "m.json")
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while trainer.proc.poll() is None and time.monotonic() < deadline:  # every process on the trainer's host
        seen += opened_under(cluster.pids(h2), str(cora_shared))
        time.sleep(0.2)
    done, *ended = wait_all([trainer, *servers], max(1.0, deadline - time.monotonic()) + 60)
    assert done.code == 0, f"trainer: exit {done.code}\n{done.stderr[-3000:]}"
    assert seen == [], "the trainer's host opened files of the dataset"
    last = metrics(tmp_path / "m.json")["epochs"][-1]
    assert last["test_acc"] >= 0.6, last
    assert last["wire"]["bytes"]["batch"] > 0
    for h, o in zip((h0, h1), ended):
        assert o.code == 0, f"server on {h.netns}: exit {o.code}\n{o.stderr[-3000:]}"
        assert f"trainers served at {h.addr}:" in o.stderr, o.stderr[-3000:]  # on the host's own address
    _no_process_left(cluster)


def test_sampler_server_killed_mid_epoch_ends_the_trainer_naming_it(rig, cora_shared):
    cluster = rig(3)
    h0, h1, h2 = cluster.hosts
    timeout = 8
    servers, trainer = _served_job(cluster, cora_shared, "--epochs", 200, "--eval-every", 200, "--fanout", "10,5",
                                   "--batch-size", 8, timeout=timeout)
    assert trainer.wait_for("epoch 1/200", 300), trainer.stderr[-3000:]
    cluster.kill_host(h1)  # kill -9 of server 1 (and anything else on its host)
    done, first = wait_all([trainer, servers[0]], timeout + 30)
    assert done.code not in (None, 0), done
    # named by the trainer (its request to server 1 failed) or by server 0 (sampling across server 1 failed)
    assert f"lost sampler server 1 at {h1.addr}" in done.stderr, done.stderr[-3000:]
    assert first.code not in (None, 0), first
    assert f"lost rank 1 at {h1.addr}" in first.stderr, first.stderr[-3000:]
    _no_process_left(cluster)
