"""Which address ranks use to reach the driver, and which interface gloo binds to."""

from __future__ import annotations

import socket

import psutil


def resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def interface_with_address(ip: str) -> str | None:
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    return None


def interface_towards(target: str) -> str:
    """The interface this host would use to reach ``target`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((resolve(target), 9))
        local_ip = s.getsockname()[0]
    return interface_with_address(local_ip) or "lo"


def gloo_interface(task_host: str, driver_host: str) -> str:
    """Prefer the interface that carries the executor's own address (what Spark uses to reach it);
    else the one that routes to the driver (the rendezvous server runs there)."""
    return interface_with_address(resolve(task_host)) or interface_towards(driver_host)
