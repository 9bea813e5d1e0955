"""GLOO_SOCKET_IFNAME is named where the hostname resolves to loopback and the group spans hosts."""

from __future__ import annotations

import os
import socket

from rlhfctl.single_controller import gloo_interface
from rlhfctl.single_controller.gloo_interface import gloo_socket_ifname, host_interfaces, pin_gloo_interface

INTERFACES = [("lo", "127.0.0.1"), ("eth0", "10.0.0.5"), ("ib0", "192.168.7.5")]


def test_a_loopback_hostname_on_a_multi_host_group_names_the_nodes_interface():
    assert gloo_socket_ifname({}, "127.0.1.1", "192.168.7.5", "192.168.7.2", INTERFACES) == "ib0"
    assert gloo_socket_ifname({}, "127.0.0.1", "10.0.0.5", "10.0.0.9", INTERFACES) == "eth0"


def test_gloos_own_choice_stands_where_it_works():
    assert gloo_socket_ifname({}, "10.0.0.5", "10.0.0.5", "10.0.0.9", INTERFACES) is None  # hostname resolves out
    assert gloo_socket_ifname({}, "127.0.1.1", "127.0.0.1", "127.0.0.1", INTERFACES) is None  # one host
    assert gloo_socket_ifname({}, "127.0.1.1", "10.0.0.5", "127.0.0.1", INTERFACES) is None  # master on loopback
    assert gloo_socket_ifname({}, None, "10.0.0.5", "10.0.0.9", INTERFACES) is None  # hostname does not resolve


def test_the_users_setting_stands_and_an_unknown_address_names_nothing():
    assert gloo_socket_ifname({"GLOO_SOCKET_IFNAME": "bond0"}, "127.0.1.1", "10.0.0.5", "10.0.0.9", INTERFACES) is None
    assert gloo_socket_ifname({}, "127.0.1.1", "172.16.0.3", "10.0.0.9", INTERFACES) is None


def test_this_hosts_interfaces_include_loopback():
    assert ("lo", "127.0.0.1") in host_interfaces()
    assert all(socket.inet_aton(address) for _, address in host_interfaces())


def test_pin_exports_the_variable_only_when_named(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(gloo_interface, "_hostname_address", lambda: "127.0.1.1")
    monkeypatch.setattr(gloo_interface, "host_interfaces", lambda: INTERFACES)
    assert pin_gloo_interface("127.0.0.1", "127.0.0.1") is None and "GLOO_SOCKET_IFNAME" not in os.environ
    assert pin_gloo_interface("10.0.0.5", "10.0.0.9") == "eth0" and os.environ["GLOO_SOCKET_IFNAME"] == "eth0"
