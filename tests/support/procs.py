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


def listening_sockets(pids: list[int]) -> list[dict]:
    """Every TCP socket in LISTEN state and every bound UDP socket owned by ``pids``
    (read in their own network namespace): proto, address, port, pid, comm."""
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
            local, state, inode = f[1], f[3], int(f[9])
            listening = state == "0A" if proto.startswith("tcp") else state == "07"
            if not listening or inode not in owner or inode in seen:
                continue
            seen.add(inode)
            host, port = local.split(":")
            if proto.startswith("udp") and int(port, 16) == 0:
                continue
            pid = owner[inode]
            out.append({"proto": proto, "address": str(_decode_addr(host)),
                        "port": int(port, 16), "pid": pid, "comm": comm(pid)})
    return out


def outside_connects(strace_text: str) -> list[str]:
    """``strace -e trace=connect`` lines whose IPv4/IPv6 address is not loopback."""
    import re

    pat = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')
    bad = []
    for line in strace_text.splitlines():
        if "connect(" not in line:
            continue
        for m in pat.finditer(line):
            addr = m.group(1) or m.group(2)
            if not is_loopback(addr):
                bad.append(line.strip()[:300])
    return bad
