"""Interface choice: the route to MASTER_ADDR on a rig host, user variables kept, --interface checked."""

from __future__ import annotations

import json
import sys

import pytest

from graphstore.errors import InvalidInputError
from tests.training.conftest import ROOT
from tests.training.multihost import clean_env
from training.launcher import netif

PROBE = """
import json, sys
from training.launcher import netif
out = []
for master, interface, env in json.loads(sys.argv[1]):
    try:
        choice = netif.configure(master, interface, log=False, env=env)
        out.append({"choice": choice and choice.__dict__, "gloo": env.get("GLOO_SOCKET_IFNAME"),
                    "tp": env.get("TP_SOCKET_IFNAME")})
    except Exception as exc:
        out.append({"error": type(exc).__name__, "message": str(exc)})
print(json.dumps(out))
"""


def _probe(cluster, host, *cases: tuple) -> list[dict]:
    """Run ``netif.configure(master, interface, env=env)`` for each case on ``host`` (one process)."""
    out = cluster.exec(host, "env", *(f"{k}={v}" for k, v in clean_env().items()),
                       sys.executable, "-c", PROBE, json.dumps(cases), timeout=120)
    return json.loads(out.stdout)


def test_loopback_master_chooses_nothing():
    env: dict[str, str] = {}
    assert netif.configure("127.0.0.1", env=env) is None and env == {}
    assert netif.configure("localhost", env=env) is None and env == {}


def test_interface_flag_sets_both_variables_and_overrides_the_user():
    env = {"GLOO_SOCKET_IFNAME": "eth9"}
    choice = netif.configure("127.0.0.1", "lo", log=False, env=env)
    assert choice.interface == "lo" and choice.address == "127.0.0.1"
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}
    with pytest.raises(InvalidInputError, match="--interface 'nosuch0' is not an interface"):
        netif.configure("127.0.0.1", "nosuch0", env={})


def test_unresolvable_master_is_named():
    with pytest.raises(ConnectionError, match="MASTER_ADDR 'no-such-host.invalid' does not resolve"):
        netif.configure("no-such-host.invalid", env={})


@pytest.mark.slow
def test_rig_hosts_choose_the_route_to_master(rig):
    cluster = rig(2)
    h0, h1 = cluster.hosts
    (mine,) = _probe(cluster, h0, (h0.addr, None, {}))
    own, kept, forced, lost = _probe(cluster, h1, (h0.addr, None, {}), (h0.addr, None, {"GLOO_SOCKET_IFNAME": "lo"}),
                                     (h0.addr, "lo", {"GLOO_SOCKET_IFNAME": "eth0"}), ("10.254.254.254", None, {}))
    # the master's own host names eth0 (the interface holding the address), not lo
    assert mine["choice"]["interface"] == "eth0" and mine["choice"]["address"] == h0.addr, mine
    assert own["choice"]["interface"] == "eth0" and own["choice"]["address"] == h1.addr, own
    assert own["gloo"] == own["tp"] == "eth0"
    assert kept["gloo"] == "lo" and kept["tp"] == "eth0", "a variable the user set is kept"
    assert forced["gloo"] == forced["tp"] == "lo", "--interface overrides the user's variables"
    # outside the rig's subnet: a host without a route (no packet is sent: a UDP connect only routes)
    assert lost["error"] == "UnreachableHostError" and "MASTER_ADDR 10.254.254.254 cannot be reached" in lost["message"]
