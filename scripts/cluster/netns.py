"""The network namespace a test cluster lives in, and what a node leaves on the host.

The namespace is persisted by a bind mount on a file in the cluster's work directory
(``unshare --net=FILE``), not in /run/netns, so creating it changes nothing else on the host.
Inside: ``lo`` and a veth pair with both ends inside (the node address on one end, the
default route out of it into the other, where nothing answers): pod, Service and node
addresses exist only there. Daemons join it with ``nsenter --net=FILE`` (network only:
dockerd must see the kubelet's volume mounts, so no mount namespace of its own).

``snapshot()`` records the host state a node could change (links, routes, iptables,
sysctls, mounts, cgroups, host paths kubelet and containerd write to); ``diff()`` lists what
differs, for teardown checks. Standard library only; root.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

NODE_IP = "10.99.0.1"
NODE_CIDR = 24
POD_BRIDGE = "10.98.0.1/24"      # dockerd --bip: pod addresses
SERVICE_RANGE = "10.96.0.0/24"   # kube-apiserver --service-cluster-ip-range
# Paths outside the work directory that kubelet 1.20, dockershim and containerd write to
# whatever their flags say (constants in their sources).
HOST_PATHS = ("/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/run/containerd",
              "/var/lib/dockershim", "/run/docker", "/var/run/docker.sock", "/etc/kubernetes",
              "/usr/libexec/kubernetes", "/var/lib/docker", "/var/lib/containerd", "/etc/cni",
              "/opt/cni", "/run/flannel", "/var/lib/cni")
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
           "net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables",
           "net/netfilter/nf_conntrack_max", "net/nf_conntrack_max",
           "net/netfilter/nf_conntrack_tcp_timeout_established",
           "net/netfilter/nf_conntrack_tcp_timeout_close_wait", "fs/inotify/max_user_watches",
           "fs/inotify/max_user_instances", "kernel/pid_max", "vm/max_map_count",
           "fs/file-max", "kernel/core_pattern")


def run(*cmd: str, check: bool = True, netns: str | None = None) -> str:
    if netns:
        cmd = ("nsenter", f"--net={netns}", "--", *cmd)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def create(path: Path) -> str:
    """A new network namespace persisted at ``path``, with the node's addresses; returns
    the path (for nsenter --net=)."""
    path.touch()
    run("unshare", f"--net={path}", "true")
    ns = str(path)
    run("ip", "link", "set", "lo", "up", netns=ns)
    run("ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer", netns=ns)
    run("ip", "addr", "add", f"{NODE_IP}/{NODE_CIDR}", "dev", "node0", netns=ns)
    run("ip", "link", "set", "node0", "up", netns=ns)
    run("ip", "link", "set", "node0-peer", "up", netns=ns)
    run("ip", "route", "add", "default", "dev", "node0", netns=ns)
    return ns


def inode(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in(ns_path: str) -> list[int]:
    """Processes (other than this one) whose network namespace is the one at ``ns_path``."""
    want = inode(ns_path)
    if want is None:
        return []
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.stat(d / "ns" / "net").st_ino == want and int(d.name) != os.getpid():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def delete(path: Path) -> None:
    """Unbind the namespace (it dies with its last process) and remove the file."""
    if path.exists():
        subprocess.run(["umount", str(path)], capture_output=True)
        try:
            path.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------------------------
# Host state, before and after.

def _mounts() -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        out.append(f"{f[4]} {f[sep + 1]} {f[sep + 2]}")   # mount point, fs type, source
    return sorted(out)


def _iptables() -> list[str]:
    rules = []
    for tool in ("iptables-save", "ip6tables-save"):
        p = subprocess.run([tool], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            if line.startswith("#"):
                continue
            rules.append(re.sub(r"\[\d+:\d+\]", "", line))   # packet counters
    return rules


def _cgroups() -> list[str]:
    out = []
    root = Path("/sys/fs/cgroup")
    for ctrl in sorted(root.iterdir()) if root.exists() else []:
        try:
            out += [f"{ctrl.name}/{c.name}" for c in ctrl.iterdir() if c.is_dir()]
        except OSError:
            continue
    return sorted(out)


def _sysctls() -> dict[str, str]:
    out = {}
    for s in SYSCTLS:
        try:
            out[s] = Path("/proc/sys", s).read_text().strip()
        except OSError:
            continue
    return out


def _paths() -> dict[str, list[str] | None]:
    out = {}
    for p in HOST_PATHS:
        q = Path(p)
        if q.is_dir() and not q.is_symlink():
            out[p] = sorted(c.name for c in q.iterdir())
        else:
            out[p] = [] if q.exists() or q.is_symlink() else None
    return out


def snapshot() -> dict:
    links = [re.sub(r"^\d+: ", "", line.split("\\")[0]).split(" link/")[0]
             for line in run("ip", "-o", "link").splitlines()]
    return {"links": sorted(links), "routes": sorted(run("ip", "route").splitlines()),
            "routes6": sorted(run("ip", "-6", "route", check=False).splitlines()),
            "iptables": _iptables(), "sysctls": _sysctls(), "mounts": _mounts(),
            "cgroups": _cgroups(), "paths": _paths()}


def diff(before: dict, after: dict) -> list[str]:
    """Human-readable differences between two snapshots (empty: the host is as found)."""
    out = []
    for k in before:
        a, b = before[k], after.get(k)
        if isinstance(a, list):
            gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            out += [f"{k}: - {x}" for x in gone] + [f"{k}: + {x}" for x in new]
        elif a != b:
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    out.append(f"{k}: {key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out
