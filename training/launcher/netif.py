"""Which local interface and address reach MASTER_ADDR; given to gloo and TensorPipe unless the user chose."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from dataclasses import dataclass
from typing import MutableMapping

from graphstore.errors import InvalidInputError, UnreachableHostError

logger = logging.getLogger(__name__)
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass(frozen=True)
class Choice:
    """The interface and address this host uses to reach the others, and why (``how``)."""

    interface: str
    address: str
    how: str


def resolve(host: str) -> str:
    """``host``'s IPv4 (or IPv6) address; raises naming the host when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UnreachableHostError(f"MASTER_ADDR {host!r} does not resolve on {socket.gethostname()} ({exc}); "
                                   f"set MASTER_ADDR to the first host's name or address") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as gloo and TensorPipe prefer
    return str(infos[0][4][0])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) means this machine's loopback (then nothing is chosen)."""
    return ipaddress.ip_address(resolve(host).split("%")[0]).is_loopback


def source_address(dest: str) -> str:
    """The local address the kernel's routing picks to reach ``dest`` (what ``ip route get`` answers).

    A UDP ``connect`` only consults the routing table: no packet is sent.
    """
    family = socket.AF_INET6 if ":" in dest else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((dest, 9))
        except OSError as exc:
            raise UnreachableHostError(f"MASTER_ADDR {dest} cannot be reached from {socket.gethostname()}: "
                                       f"{exc.strerror or exc} (no route); check MASTER_ADDR, or this host's "
                                       f"network, or pass --interface NAME") from exc
        return str(sock.getsockname()[0])


def interfaces() -> dict[str, list[str]]:
    """Interface name -> its IPv4/IPv6 addresses on this host."""
    import psutil

    return {name: [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
            for name, addrs in psutil.net_if_addrs().items()}


def interface_of(address: str) -> str:
    """The interface holding ``address`` (so a host reaching its own MASTER_ADDR names eth0, not lo)."""
    for name, addrs in interfaces().items():
        if address in addrs:
            return name
    raise UnreachableHostError(f"no interface on {socket.gethostname()} holds address {address}; pass --interface")


def check_interface(interface: str) -> list[str]:
    """The addresses of ``interface`` (``--interface``) on this host; raises naming the host's interfaces
    when it has no such interface, or when the interface holds no address (down, or not configured)."""
    found = interfaces()
    if interface not in found:
        raise InvalidInputError(f"--interface {interface!r} is not an interface of {socket.gethostname()} "
                                f"(it has {sorted(found)}); give one of them, or leave --interface out to use "
                                "the one on the route to MASTER_ADDR")
    if not found[interface]:
        raise InvalidInputError(f"--interface {interface!r} has no IPv4/IPv6 address on {socket.gethostname()} "
                                "(down or not configured); bring it up, or give another interface")
    return found[interface]


def choose(master_addr: str, interface: str | None = None) -> Choice | None:
    """The interface for this host: ``interface`` if given (checked), else the one on the route to
    ``master_addr``; ``None`` when the master is this machine's loopback (single-host jobs)."""
    if interface is not None:
        addresses = check_interface(interface)
        ipv4 = [a for a in addresses if ":" not in a]
        return Choice(interface, (ipv4 or addresses)[0], "--interface")
    if is_loopback(master_addr):
        return None
    address = source_address(resolve(master_addr))
    return Choice(interface_of(address), address, f"route to MASTER_ADDR {master_addr}")


def configure(master_addr: str, interface: str | None = None, log: bool = True,
              env: MutableMapping[str, str] | None = None) -> Choice | None:
    """Choose this host's interface and set ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` to it; variables
    the user set stay as they are unless ``interface`` (``--interface``) overrides them. Logged once per
    host (``log`` is true on local rank 0)."""
    env = os.environ if env is None else env
    choice = choose(master_addr, interface)
    if choice is None:
        return None
    kept = []
    for var in IFNAME_VARS:
        if interface is None and env.get(var):
            kept.append(f"{var}={env[var]}")
        else:
            env[var] = choice.interface
    if log:
        logger.warning("network: %s uses interface %s (%s, from the %s)%s", socket.gethostname(), choice.interface,
                       choice.address, choice.how, f"; kept the user's {', '.join(kept)}" if kept else "")
    return choice
