"""Loopback port allocation: a fixed layout from ``--base-port``, or free ports from the
kernel. Every port is checked before anything starts, so a port in use is one clear error
instead of a half-started stack."""

from __future__ import annotations

import socket
from dataclasses import dataclass


class PortInUse(RuntimeError):
    pass


@dataclass(frozen=True)
class Ports:
    router: int
    prometheus: int
    engines: tuple[int, ...]
    sidecars: tuple[int, ...]

    def all(self) -> list[tuple[str, int]]:
        out = [("router", self.router), ("prometheus", self.prometheus)]
        out += [(f"engine {i}", p) for i, p in enumerate(self.engines)]
        out += [(f"node-agent {i}", p) for i, p in enumerate(self.sidecars)]
        return out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def layout(engines: int, base_port: int = 0) -> Ports:
    """``base_port`` 0: kernel-chosen free ports. Else router ``B``, Prometheus ``B+1``,
    engine i ``B+10+i``, node agent i ``B+40+i``."""
    if base_port:
        if not 1024 <= base_port <= 65535 - 80:
            raise ValueError(f"--base-port must be in 1024..65455, got {base_port}")
        return Ports(base_port, base_port + 1,
                     tuple(base_port + 10 + i for i in range(engines)),
                     tuple(base_port + 40 + i for i in range(engines)))
    ports: list[int] = []
    while len(ports) < 2 + 2 * engines:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return Ports(ports[0], ports[1], tuple(ports[2:2 + engines]), tuple(ports[2 + engines:]))


def check_free(ports: Ports, host: str = "127.0.0.1") -> None:
    for name, port in ports.all():
        if not is_free(port, host):
            raise PortInUse(f"port {port} ({name}) is already in use on {host}; "
                            "pick another --base-port")
