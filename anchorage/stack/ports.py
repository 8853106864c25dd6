"""Loopback port allocation: a fixed layout from ``--base-port``, or free ports. Every port
is checked before anything starts, so a port in use is one clear error instead of a
half-started stack.

Free ports are drawn between 20,000 and the start of the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, usually 32,768), not asked of the kernel: a
kernel-chosen port is an ephemeral one, and between the check and the service's bind the
kernel can hand it to another process's outgoing connection or kernel-chosen listener
(Ray and vLLM open dozens while the stack starts). Ray's worker ports (10,002-19,999 by
default) are below the range. Without room there, the kernel chooses."""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass

FREE_PORT_LOW = 20000
_TRIES = 200


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


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (32768 if unreadable)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port free on ``host`` now, outside the kernel's ephemeral range (module doc)."""
    lo, hi = FREE_PORT_LOW, ephemeral_low()
    if hi - lo >= 100:
        rng = rng or random.Random()
        for _ in range(_TRIES):
            port = rng.randrange(lo, hi)
            if is_free(port, host):
                return port
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

