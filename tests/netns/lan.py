"""Test hosts in network namespaces: N hosts on one virtual LAN (veth pairs into a bridge in a hub namespace).

Everything is created by the test and removed afterwards; no traffic leaves these namespaces. Addresses come from
10.213.<subnet>.0/24, used only inside these namespaces. Requires root and iproute2; tests skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def netns_available() -> str | None:
    """None when namespaces can be made here, else why not (the skip reason)."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    name = f"arcprobe{uuid.uuid4().hex[:6]}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    interface: str = "eth0"

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *cmd]


@contextmanager
def virtual_lan(count: int, subnet: int = 7) -> Iterator[list[Host]]:
    tag = uuid.uuid4().hex[:6]
    hub = f"arc{tag}hub"
    made: list[str] = []
    hosts: list[Host] = []
    try:
        _ip("netns", "add", hub)
        made.append(hub)
        _ip("link", "add", "br0", "type", "bridge", ns=hub)
        _ip("link", "set", "br0", "up", ns=hub)
        for i in range(count):
            ns = f"arc{tag}h{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
            outer, inner = f"v{tag}{i}", f"e{tag}{i}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "netns", hub)
            _ip("link", "set", outer, "master", "br0", ns=hub)
            _ip("link", "set", outer, "up", ns=hub)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", inner, "name", "eth0", ns=ns)
            address = f"10.213.{subnet}.{i + 2}"
            _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("route", "add", "224.0.0.0/4", "dev", "eth0", ns=ns)
            hosts.append(Host(ns, address))
        yield hosts
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
