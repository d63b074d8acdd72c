"""The multi-host rig itself: hosts reach each other, links shape and cut, and nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster import Cluster, _ip, require_rig, sweep_stale

pytestmark = [pytest.mark.distributed]

SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
s.settimeout(20); c, _ = s.accept(); c.sendall(b"hello from " + sys.argv[1].encode()); c.close()
"""
CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
print(s.recv(100).decode())
"""


def _serve(cluster: Cluster, host) -> tuple[subprocess.Popen, int]:
    server = cluster.popen(host, [sys.executable, "-c", SERVER, host.addr], stdout=subprocess.PIPE, text=True)
    return server, int(server.stdout.readline())


def test_hosts_talk_over_the_bridge_and_a_cut_link_drops_packets(rig):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    assert h0.addr != h1.addr and h0.addr.startswith("10.")
    server, port = _serve(cluster, h0)
    out = cluster.exec(h1, sys.executable, "-c", CLIENT, h0.addr, str(port), "10")
    assert out.stdout.strip() == f"hello from {h0.addr}"
    server.wait(timeout=10)
    server, port = _serve(cluster, h0)
    cluster.link_down(h1)
    cut = subprocess.run(["ip", "netns", "exec", h1.netns, sys.executable, "-c", CLIENT, h0.addr, str(port), "2"],
                         capture_output=True, text=True, timeout=30)
    assert cut.returncode != 0 and "timed out" in cut.stderr, cut.stderr
    cluster.link_up(h1)
    out = cluster.exec(h1, sys.executable, "-c", CLIENT, h0.addr, str(port), "10")
    assert out.stdout.strip() == f"hello from {h0.addr}"


def test_a_host_sees_only_its_own_interfaces(rig):
    cluster = rig(2)
    links = cluster.exec(cluster.hosts[0], "ip", "-o", "addr").stdout
    assert cluster.hosts[0].addr in links and cluster.hosts[1].addr not in links and "eth0" in links


def test_shape_installs_tbf_on_both_ends(rig):
    cluster = rig(1)
    host = cluster.hosts[0]
    cluster.shape(host, "100mbit")
    assert "tbf" in cluster.qdisc(host) and "100Mbit" in cluster.qdisc(host)
    inside = cluster.exec(host, "tc", "qdisc", "show", "dev", "eth0").stdout
    assert "tbf" in inside and "100Mbit" in inside


def test_close_kills_host_processes_and_removes_every_link(rig):
    cluster = rig(2)
    sleeper = cluster.popen(cluster.hosts[1], ["sleep", "300"])
    # a grandchild started inside the namespace but outside our process group is found and killed too
    cluster.exec(cluster.hosts[0], "sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &")
    stray = cluster.pids(cluster.hosts[0])
    assert stray and cluster.leftovers()
    cluster.close()
    assert sleeper.poll() is not None
    assert not any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in stray)
    assert cluster.leftovers() == []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_sweep_removes_rigs_of_dead_owners_only(rig):
    rig(1)  # checks root and iproute2 (skips/fails like every rig test)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, mine = f"gs{dead.pid}zh0", f"gs{os.getpid()}zh0"
    for name in (stale, mine):
        _ip("netns", "add", name)
    try:
        removed = sweep_stale()
        names = _ip("netns", "list").stdout
        assert stale in removed and stale not in names
        assert mine in names, "a live owner's namespace must survive the sweep"
    finally:
        for name in (stale, mine):
            _ip("netns", "del", name, check=False)


def test_missing_root_skips_but_fails_under_ci():
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        require_rig("the multi-host rig needs root", {})
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        require_rig("the multi-host rig needs root", {"CI": "true"})
    require_rig(None, {"CI": "true"})  # where the rig can run, nothing happens
