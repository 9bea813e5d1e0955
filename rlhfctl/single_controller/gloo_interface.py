"""Which network interface gloo binds to on a host whose name resolves to loopback.

gloo picks its interface by resolving the host's name. Many images map the hostname to ``127.0.1.1`` or
``127.0.0.1`` in ``/etc/hosts``; a gloo group spanning two nodes then binds to loopback, and the other
node's connect waits out the group's timeout. Every gloo group a rank makes inherits the choice: the
default group on CPU, and the side groups on GPU runs (the async checkpoint writer's, vLLM's world).

The rule: when ``GLOO_SOCKET_IFNAME`` is unset, the hostname resolves to loopback and the group's master
is another host's address, name the interface that carries this node's own address (the one Ray knows it
by). A single-host group (master on loopback) keeps gloo's default.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Mapping

__all__ = ["gloo_socket_ifname", "host_interfaces", "pin_gloo_interface"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def gloo_socket_ifname(env: Mapping[str, str], hostname_address: str | None, node_address: str | None,
                       master_address: str | None, interfaces: Iterable[tuple[str, str]]) -> str | None:
    """The interface to export as ``GLOO_SOCKET_IFNAME``, or None to leave gloo's own choice alone."""
    if env.get("GLOO_SOCKET_IFNAME"):
        return None  # the user's choice stands
    if not _is_loopback(hostname_address) or _is_loopback(master_address) or _is_loopback(node_address):
        return None  # gloo's default reaches the other ranks, or every rank is on this host
    for name, address in interfaces:
        if address == node_address:
            return name
    return None


def host_interfaces() -> list[tuple[str, str]]:
    """``(interface, IPv4 address)`` of every interface that has one (Linux)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def _hostname_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def pin_gloo_interface(node_address: str | None, master_address: str | None) -> str | None:
    """Export ``GLOO_SOCKET_IFNAME`` where :func:`gloo_socket_ifname` says so; returns the interface named."""
    name = gloo_socket_ifname(os.environ, _hostname_address(), node_address, master_address, host_interfaces())
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name
