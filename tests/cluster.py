"""A multi-host test rig: N network namespaces ("hosts") on a bridge with 10.x addresses, links shaped or cut.

Each host is a network namespace ``gs<pid><tag>h<i>`` whose interface ``eth0`` is one end of a veth pair;
the other end (``gs<pid><tag>v<i>``) sits on the bridge ``gs<pid><tag>b``, which carries the subnet's
``.254`` address (servers the hosts should reach, such as moto, listen there). Commands run "on a host"
through ``ip netns exec``. Everything made is removed by :meth:`Cluster.close` (also on failure or
interrupt), and a new rig first sweeps away leftovers of rigs whose owning process is dead.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "gs"
_NAME = re.compile(rf"^{PREFIX}(\d+)[a-z]")
_TAGS = itertools.count()


def rig_unavailable() -> str | None:
    """Why this machine cannot run the rig (not root, no ``ip``/``tc``), or ``None`` when it can."""
    if os.geteuid() != 0:
        return "the multi-host rig needs root (network namespaces, veth pairs, a bridge)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the multi-host rig needs {' and '.join(missing)} (iproute2)"
    return None


def require_rig(reason: str | None, env: dict[str, str]) -> None:
    """Skip (with ``reason``) where the rig cannot run; under ``CI=true`` fail instead: CI must run it."""
    import pytest

    if reason is None:
        return
    if env.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}: the multi-host tests must run in CI, not skip")
    pytest.skip(reason)


def _ip(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")
    return out


def _owner_alive(name: str) -> bool:
    match = _NAME.match(name)
    return match is None or os.path.exists(f"/proc/{match.group(1)}")


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL every process inside ``netns`` and wait (bounded) until none is left."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def sweep_stale() -> list[str]:
    """Remove namespaces and links of rigs whose owner process is gone; returns their names."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if _NAME.match(name) and not _owner_alive(name):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if _NAME.match(name) and not _owner_alive(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> str:
    """A 10.a.b.0/24 that no address or route on this machine uses (picked from the pid, then probed)."""
    used = _ip("-o", "addr", check=False).stdout + _ip("route", check=False).stdout
    start = os.getpid() * 7 + next(_TAGS) * 131
    for k in range(4000):
        n = (start + k) % (200 * 250)
        a, b = 50 + n // 250, n % 250
        if f"10.{a}.{b}." not in used:
            return f"10.{a}.{b}"
    raise RuntimeError("no free 10.x.y.0/24 subnet found for the multi-host rig")


@dataclass
class Host:
    """One namespace: its name, its address on the bridge, and the root-side end of its link."""

    index: int
    netns: str
    addr: str
    link: str  # root-namespace veth end (shape it, cut it)


class Cluster:
    """``n`` hosts on one bridge; use as a context manager (or call :meth:`close`)."""

    def __init__(self, n: int) -> None:
        sweep_stale()
        tag = "abcdefghijklmnopqrstuvwxyz"[next(_TAGS) % 26]
        self.base = f"{PREFIX}{os.getpid()}{tag}"
        self.subnet = _free_subnet()
        self.bridge, self.bridge_addr = f"{self.base}b", f"{self.subnet}.254"
        self.hosts: list[Host] = []
        self._procs: list[subprocess.Popen] = []
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), in creation order
        atexit.register(self.close)  # an interrupted run still leaves nothing behind
        try:
            self._build(n)
        except BaseException:
            self.close()
            raise

    def _build(self, n: int) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(n):
            netns, outer, inner = f"{self.base}h{i}", f"{self.base}v{i}", f"{self.base}p{i}"
            _ip("netns", "add", netns)
            self._made.append(("netns", netns))
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._made.append(("link", outer))
            _ip("link", "set", inner, "netns", netns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            host = Host(i, netns, f"{self.subnet}.{i + 1}", outer)
            self.exec(host, "ip", "link", "set", inner, "name", "eth0")
            self.exec(host, "ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
            self.exec(host, "ip", "link", "set", "eth0", "up")
            self.exec(host, "ip", "link", "set", "lo", "up")
            self.hosts.append(host)
        for host in self.hosts:
            self._wait_up(host)

    def _wait_up(self, host: Host, seconds: float = 10) -> None:
        """Bounded wait until both ends of ``host``'s link have carrier (veth comes up asynchronously)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            outer = _ip("-o", "link", "show", host.link, check=False).stdout
            inner = self.exec(host, "ip", "-o", "link", "show", "eth0").stdout
            if "LOWER_UP" in outer and "LOWER_UP" in inner:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{host.netns}: link {host.link} did not come up within {seconds:.0f} s")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running things on a host --

    def exec(self, host: Host, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``cmd`` on ``host`` to completion; raises with its stderr when it fails."""
        out = subprocess.run(["ip", "netns", "exec", host.netns, *cmd], capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{host.netns}: {' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def popen(self, host: Host, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` on ``host`` (its own session, so it and its children can be killed together)."""
        proc = subprocess.Popen(["ip", "netns", "exec", host.netns, *cmd], start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, host: Host) -> list[int]:
        """Every process now running inside ``host``'s namespace."""
        return [int(p) for p in _ip("netns", "pids", host.netns, check=False).stdout.split()]

    def kill_host(self, host: Host) -> None:
        """The host dies: SIGKILL every process in its namespace."""
        _kill_namespace_processes(host.netns)

    # -- the network --

    def link_down(self, host: Host) -> None:
        """Cut ``host`` off the bridge (packets dropped silently: peers see a hang, not a reset)."""
        _ip("link", "set", host.link, "down")

    def link_up(self, host: Host) -> None:
        """Reconnect ``host``; neighbour entries that failed while it was cut are flushed everywhere."""
        _ip("link", "set", host.link, "up")
        self._wait_up(host)
        for other in self.hosts:
            self.exec(other, "ip", "neigh", "flush", "all")

    def shape(self, host: Host, rate: str, burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit ``host``'s link to ``rate`` (e.g. ``"100mbit"``) both ways, with ``tbf`` on each veth end."""
        subprocess.run(["tc", "qdisc", "replace", "dev", host.link, "root", "tbf", "rate", rate, "burst", burst,
                        "latency", latency], check=True, capture_output=True, timeout=20)
        self.exec(host, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", burst,
                  "latency", latency)

    def qdisc(self, host: Host) -> str:
        """``tc qdisc show`` of ``host``'s root-side link (to check shaping took effect)."""
        return subprocess.run(["tc", "qdisc", "show", "dev", host.link], capture_output=True, text=True,
                              timeout=20).stdout

    # -- tear-down --

    def close(self) -> None:
        """Kill every process started or found on a host, then delete namespaces, links and the bridge."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for kind, name in reversed(self._made):
            if kind == "netns":
                _kill_namespace_processes(name)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._made.clear()

    def leftovers(self) -> list[str]:
        """Names of this rig's namespaces and links that still exist (empty after :meth:`close`)."""
        text = _ip("netns", "list", check=False).stdout + _ip("-o", "link", "show", check=False).stdout
        return sorted(set(re.findall(rf"\b{self.base}[a-z]\d*\b", text)))
